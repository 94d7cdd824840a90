/* The geometry of a recurrent layer (RNN, GRU, LSTM) as the reference kernel (rnn.c) reads
 * it from the node and checks it against its operands, shared with the fast kernel
 * (kernels/fast/rnn.c) so that both accept the same nodes and read them the same way. */
#ifndef AF_KERNELS_REF_RNN_H
#define AF_KERNELS_REF_RNN_H

#include "kernels/ref/ref.h"

typedef enum rnn_kind { RNN_SIMPLE, RNN_GRU, RNN_LSTM } rnn_kind;

typedef enum rnn_fn {
    FN_RELU, FN_TANH, FN_SIGMOID, FN_AFFINE, FN_LEAKYRELU, FN_THRESHOLDEDRELU, FN_SCALEDTANH,
    FN_HARDSIGMOID, FN_ELU, FN_SOFTSIGN, FN_SOFTPLUS
} rnn_fn;

typedef struct rnn_act {
    rnn_fn fn;
    double alpha, beta;
} rnn_act;

#define RNN_MAXACT 6 /* 3 activations (LSTM) x 2 directions */

typedef struct rnn_geom {
    rnn_kind kind;
    int gates;      /* weight blocks: 1 RNN, 3 GRU (z r h), 4 LSTM (i o f c) */
    int nact;       /* activations per direction */
    int ndir;
    bool reverse;   /* direction = "reverse" (the only direction) */
    int layout;     /* 0: [seq, batch, ...]; 1: [batch, seq, ...] */
    int64_t seq, batch, input, hidden;
    double clip;    /* <= 0: none */
    rnn_act act[RNN_MAXACT];
} rnn_geom;

/* g from node n and its operands (shapes checked, activations parsed; dims unknown at
 * compile time are -1), or an error naming the node. */
af_status rnn_prepare(const af_node *n, const af_tensor *const *in, rnn_geom *g, af_error *err);

#endif
