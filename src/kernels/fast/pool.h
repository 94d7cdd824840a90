/* Channels-last pooling (pool_fast.c), the entry points pool.c hands a node with
 * channels_last = 1 to: global (GlobalAveragePool / GlobalMaxPool) or windowed (MaxPool /
 * AveragePool), max or average. */
#ifndef AF_KERNELS_POOL_FAST_H
#define AF_KERNELS_POOL_FAST_H

#include "kernels/kernel.h"

af_status fk_shape_pool_cl(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           bool global, int max, af_error *err);
af_status fk_kernel_pool_cl(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            bool global, int max, af_exec *ex, af_error *err);

#endif
