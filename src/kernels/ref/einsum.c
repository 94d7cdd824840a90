/* Reference Einsum (ONNX opset 12+): any number of operands, explicit ("ij,jk->ik") or implicit
 * output, repeated labels within an operand (diagonals), "..." broadcasting.
 *
 * Invariant: the equation is parsed and checked against the operand ranks and dims into an
 * es_plan before anything is indexed. Every label gets one size; each operand reads element
 * sum(label value * label stride), where a label's stride is the sum of the strides of the
 * operand dims carrying it (that is how a repeated label walks a diagonal) and 0 for a
 * broadcast size-1 "..." dim. Output labels come first in the loop order, so each output
 * element is one accumulator, summed over the contracted labels and written once. */
#include "kernels/ref/nn_common.h"

#include <stdlib.h>

#define ES_LETTERS 52                        /* A-Z are labels 0..25, a-z 26..51 (ASCII order) */
#define ES_MAXLAB (ES_LETTERS + AF_MAX_RANK) /* then one label per "..." dim */
#define ES_MAXIN 16
#define ES_ELL (-1)                          /* token for "..." */

typedef struct es_term {
    int ntok, tok[AF_MAX_RANK + 1]; /* letters as written, ES_ELL for "..." */
    int nletters;
    bool has_ell;
    int rank;                       /* after expanding "..."; -1 when unknown */
    int lab[AF_MAX_RANK];           /* label of each dim */
} es_term;

typedef struct es_plan {
    int nin;
    es_term in[ES_MAXIN];
    es_term out;
    int ell; /* dims that "..." stands for (the largest over the operands) */
    int64_t size[ES_MAXLAB];
    int uses[ES_MAXLAB]; /* occurrences over all operands */
} es_plan;

static int es_label(char c) {
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return 26 + (c - 'a');
    return -1;
}

/* Parse one term s[0..len) into tokens. */
static af_status es_term_parse(const af_node *n, const char *s, size_t len, es_term *t,
                               af_error *err) {
    memset(t, 0, sizeof(*t));
    for (size_t i = 0; i < len;) {
        if (s[i] == '.') {
            if (t->has_ell || i + 3 > len || s[i + 1] != '.' || s[i + 2] != '.')
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad '...' in equation");
            t->has_ell = true;
            t->tok[t->ntok++] = ES_ELL;
            i += 3;
            continue;
        }
        int l = es_label(s[i]);
        if (l < 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad character '%c' in equation",
                                s[i]);
        if (t->nletters == AF_MAX_RANK)
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "more than %d labels in a term",
                                AF_MAX_RANK);
        t->tok[t->ntok++] = l;
        t->nletters++;
        i++;
    }
    return AF_OK;
}

/* Expand an operand term against its rank (r < 0: unknown). "..." of e dims maps to the last e
 * of the plan's `ell` ellipsis labels, so that shorter ellipses broadcast right-aligned. */
static af_status es_expand(const af_node *n, es_term *t, int r, int ell, af_error *err) {
    t->rank = r;
    if (r < 0)
        return AF_OK;
    int e = r - t->nletters, d = 0;
    if (e < 0 || (!t->has_ell && e != 0))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "equation term has %d labels for an operand of rank %d",
                            t->nletters, r);
    for (int i = 0; i < t->ntok; i++) {
        if (t->tok[i] != ES_ELL) {
            t->lab[d++] = t->tok[i];
            continue;
        }
        for (int k = 0; k < e; k++)
            t->lab[d++] = ES_LETTERS + (ell - e) + k;
    }
    return AF_OK;
}

/* Parse the equation against the operands (whose ranks/dims may be unknown at compile time).
 * Sets *known = false when an operand rank needed to expand "..." is unknown. */
static af_status es_plan_make(const af_node *n, const af_tensor *const *in, es_plan *p,
                              bool *known, af_error *err) {
    memset(p, 0, sizeof(*p));
    *known = true;
    const char *eq = af_attr_str(n, "equation", NULL);
    if (!eq)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing attribute equation");
    char buf[512];
    size_t len = 0;
    for (const char *c = eq; *c; c++) {
        if (*c == ' ')
            continue;
        if (len + 1 >= sizeof(buf))
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "equation too long");
        buf[len++] = *c;
    }
    buf[len] = '\0';
    char *arrow = strstr(buf, "->");
    size_t lhs_len = arrow ? (size_t)(arrow - buf) : len;
    if (n->nin < 1 || n->nin > ES_MAXIN)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%d operands (1 to %d supported)", n->nin,
                            ES_MAXIN);
    p->nin = n->nin;
    size_t start = 0;
    for (int i = 0; i < p->nin; i++) {
        size_t end = start;
        while (end < lhs_len && buf[end] != ',')
            end++;
        if ((end == lhs_len) != (i == p->nin - 1))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "equation has a different number of terms than %d inputs",
                                p->nin);
        af_status st = es_term_parse(n, buf + start, end - start, &p->in[i], err);
        if (st != AF_OK)
            return st;
        start = end + 1;
    }
    /* "..." stands for the most dims any operand gives it. */
    for (int i = 0; i < p->nin; i++) {
        const af_tensor *t = in[i];
        if (!t)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing operand %d", i);
        if (t->rank < 0 && p->in[i].has_ell)
            *known = false;
        else if (t->rank >= 0 && p->in[i].has_ell && t->rank - p->in[i].nletters > p->ell)
            p->ell = t->rank - p->in[i].nletters;
    }
    if (!*known)
        return AF_OK;
    for (int i = 0; i < ES_MAXLAB; i++)
        p->size[i] = -1;
    for (int i = 0; i < p->nin; i++) {
        af_status st = es_expand(n, &p->in[i], in[i]->rank, p->ell, err);
        if (st != AF_OK)
            return st;
        for (int d = 0; d < p->in[i].rank; d++) {
            int l = p->in[i].lab[d];
            int64_t sz = in[i]->dims[d], *have = &p->size[l];
            p->uses[l]++;
            if (sz < 0)
                continue;
            if (l >= ES_LETTERS) { /* "..." dims broadcast */
                if (*have < 0 || *have == 1)
                    *have = sz;
                else if (sz != 1 && sz != *have)
                    return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "'...' dims do not broadcast");
            } else if (*have >= 0 && *have != sz) {
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "label '%c' has sizes %lld and %lld",
                                    l < 26 ? 'A' + l : 'a' + (l - 26), (long long)*have,
                                    (long long)sz);
            } else {
                *have = sz;
            }
        }
    }
    es_term *o = &p->out;
    if (arrow) {
        af_status st = es_term_parse(n, arrow + 2, len - lhs_len - 2, o, err);
        if (st != AF_OK)
            return st;
        for (int i = 0; i < o->ntok; i++)
            for (int j = 0; j < i; j++)
                if (o->tok[i] == o->tok[j] && o->tok[i] != ES_ELL)
                    return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "repeated output label");
        for (int i = 0; i < o->ntok; i++)
            if (o->tok[i] != ES_ELL && p->uses[o->tok[i]] == 0)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "output label not in any input");
        if (o->nletters + (o->has_ell ? p->ell : 0) > AF_MAX_RANK)
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "output rank above %d", AF_MAX_RANK);
        o->rank = 0;
        for (int i = 0; i < o->ntok; i++) {
            if (o->tok[i] != ES_ELL) {
                o->lab[o->rank++] = o->tok[i];
                continue;
            }
            for (int k = 0; k < p->ell; k++)
                o->lab[o->rank++] = ES_LETTERS + k;
        }
    } else {
        /* Implicit output: "..." dims, then the letters used once, in alphabetical order. */
        o->rank = 0;
        for (int k = 0; k < p->ell; k++)
            o->lab[o->rank++] = ES_LETTERS + k;
        for (int l = 0; l < ES_LETTERS; l++)
            if (p->uses[l] == 1) {
                if (o->rank == AF_MAX_RANK)
                    return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "output rank above %d",
                                        AF_MAX_RANK);
                o->lab[o->rank++] = l;
            }
    }
    return AF_OK;
}

static bool es_type_ok(af_dtype t) {
    return nn_is_float(t) || nn_is_int(t);
}

static af_status es_prepare(const af_node *n, const af_tensor *const *in, es_plan *p, bool *known,
                            af_error *err) {
    for (int i = 0; i < n->nin; i++)
        if (!in[i])
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing operand %d", i);
    for (int i = 0; i < n->nin; i++)
        if (!es_type_ok(in[i]->dtype) || in[i]->dtype != in[0]->dtype)
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "Einsum operand %d is %s", i,
                                af_dtype_name(in[i]->dtype));
    return es_plan_make(n, in, p, known, err);
}

af_status shape_einsum(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    es_plan p;
    bool known;
    af_status st = es_prepare(n, in, &p, &known, err);
    if (st != AF_OK)
        return st;
    if (!known) {
        af_tensor_set_type(&out[0], in[0]->dtype, -1, NULL);
        return AF_OK;
    }
    int64_t dims[AF_MAX_RANK];
    for (int i = 0; i < p.out.rank; i++)
        dims[i] = p.size[p.out.lab[i]];
    af_tensor_set_type(&out[0], in[0]->dtype, p.out.rank, dims);
    return AF_OK;
}

/* Loop order and per-operand label strides. */
typedef struct es_loop {
    int nlab, nout;          /* labels in the loop; the first nout are the output's */
    int lab[ES_MAXLAB];
    int64_t size[ES_MAXLAB];
    int64_t stride[ES_MAXIN][ES_MAXLAB];
    int64_t inner;           /* iterations per output element */
} es_loop;

static af_status es_loop_make(const af_node *n, const es_plan *p, const af_tensor *const *in,
                              es_loop *lp, af_error *err) {
    memset(lp, 0, sizeof(*lp));
    bool in_out[ES_MAXLAB] = {false};
    for (int i = 0; i < p->out.rank; i++) {
        lp->lab[lp->nlab++] = p->out.lab[i];
        in_out[p->out.lab[i]] = true;
    }
    lp->nout = lp->nlab;
    lp->inner = 1;
    for (int l = 0; l < ES_MAXLAB; l++)
        if (p->uses[l] > 0 && !in_out[l]) {
            lp->lab[lp->nlab++] = l;
            if (!af_mul_i64(lp->inner, p->size[l], &lp->inner))
                return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "contraction too large");
        }
    for (int k = 0; k < lp->nlab; k++)
        lp->size[k] = p->size[lp->lab[k]];
    for (int i = 0; i < p->nin; i++) {
        int64_t s = 1;
        for (int d = p->in[i].rank - 1; d >= 0; d--) {
            int l = p->in[i].lab[d];
            for (int k = 0; k < lp->nlab; k++)
                if (lp->lab[k] == l && !(in[i]->dims[d] == 1 && lp->size[k] != 1))
                    lp->stride[i][k] += s;
            s *= in[i]->dims[d];
        }
    }
    return AF_OK;
}

/* Offsets of every operand for loop labels [from, to) set from a row-major counter c. */
static void es_offsets(const es_loop *lp, int nin, int from, int to, int64_t c, int64_t *off) {
    for (int i = 0; i < nin; i++)
        off[i] = 0;
    for (int k = to - 1; k >= from; k--) {
        int64_t v = c % lp->size[k];
        c /= lp->size[k];
        for (int i = 0; i < nin; i++)
            off[i] += v * lp->stride[i][k];
    }
}

af_status ref_einsum(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    (void)ex;
    es_plan p;
    es_loop lp;
    bool known;
    af_status st = es_prepare(n, in, &p, &known, err);
    if (st == AF_OK && !known)
        st = af_node_fail(err, n, AF_ERR_INTERNAL, "operand ranks unknown at run time");
    for (int i = 0; st == AF_OK && i < n->nin; i++)
        if (!af_tensor_known(in[i]))
            st = af_node_fail(err, n, AF_ERR_INTERNAL, "operand %d shape unknown", i);
    if (st == AF_OK) {
        int64_t dims[AF_MAX_RANK];
        for (int i = 0; i < p.out.rank; i++)
            dims[i] = p.size[p.out.lab[i]];
        st = nn_check_out(n, &out[0], p.out.rank, dims, err);
    }
    if (st == AF_OK)
        st = es_loop_make(n, &p, in, &lp, err);
    if (st != AF_OK)
        return st;
    bool is_int = nn_is_int(in[0]->dtype);
    int64_t total = af_tensor_numel(&out[0]);
    int64_t base[ES_MAXIN], off[ES_MAXIN];
    for (int64_t o = 0; o < total; o++) {
        es_offsets(&lp, p.nin, 0, lp.nout, o, base);
        double acc = 0.0;
        uint64_t iacc = 0;
        for (int64_t c = 0; c < lp.inner; c++) {
            es_offsets(&lp, p.nin, lp.nout, lp.nlab, c, off);
            double prod = 1.0;
            uint64_t iprod = 1;
            for (int i = 0; i < p.nin; i++) {
                int64_t at = base[i] + off[i];
                if (is_int)
                    iprod *= (uint64_t)nn_geti(in[i], at);
                else
                    prod *= af_tensor_get_double(in[i], at);
            }
            acc += prod;
            iacc += iprod;
        }
        if (is_int)
            nn_puti(&out[0], o, iacc);
        else
            nn_put(&out[0], o, acc);
    }
    return AF_OK;
}
