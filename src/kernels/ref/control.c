/* Control flow: If, Loop and Scan run their body subgraphs through the executor. Their outputs'
 * shapes are only known after running, so the kernels allocate (move) them themselves.
 *
 * Invariant: a body runs with exactly the inputs its graph declares, and its outputs are checked
 * against the node before they are moved. */
#include "kernels/ref/ref.h"

static const af_graph *graph_attr(const af_node *n, const char *name) {
    const af_attr *a = af_node_attr(n, name);
    return a && a->type == AF_ATTR_GRAPH ? a->g : NULL;
}

/* Static type of a subgraph output: what the body's inference found. */
static const af_tensor *body_out(const af_graph *g, int i) { return &g->outputs[i]->type; }

static void join_type(af_tensor *dst, const af_tensor *a, const af_tensor *b) {
    dst->dtype = a->dtype ? a->dtype : b->dtype;
    if (a->rank != b->rank || a->rank < 0) {
        dst->rank = a->rank == b->rank ? a->rank : -1;
        return;
    }
    dst->rank = a->rank;
    for (int i = 0; i < a->rank; i++) dst->dims[i] = a->dims[i] == b->dims[i] ? a->dims[i] : -1;
}

/* Move a finished tensor into a kernel output slot (replacing what the executor allocated). */
static void put(af_tensor *slot, af_tensor *t) {
    af_tensor_release(slot);
    *slot = *t;
    memset(t, 0, sizeof *t);
}

static bool scalar_true(const af_tensor *t) {
    return t && t->data && af_tensor_numel(t) >= 1 && af_tensor_get_int(t, 0) != 0;
}

/* ---- If ---------------------------------------------------------------------------------- */

af_status shape_if(const af_node *n, const af_tensor *const *in, af_tensor *out, af_error *err) {
    (void)in;
    const af_graph *t = graph_attr(n, "then_branch"), *e = graph_attr(n, "else_branch");
    if (!t || !e) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing then/else branch");
    if (t->noutputs != n->nout || e->noutputs != n->nout)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "branches have %d and %d outputs, the node %d", t->noutputs,
                            e->noutputs, n->nout);
    for (int i = 0; i < n->nout; i++) {
        join_type(&out[i], body_out(t, i), body_out(e, i));
        out[i].rank = -1; /* allocate in the kernel: the branch decides */
    }
    return AF_OK;
}

af_status ref_if(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                       af_error *err) {
    if (n->nin < 1 || !in[0] || af_tensor_numel(in[0]) != 1)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "condition must be one element");
    const af_graph *b = graph_attr(n, scalar_true(in[0]) ? "then_branch" : "else_branch");
    af_tensor *res = af_calloc((size_t)n->nout + 1, sizeof(af_tensor));
    if (!res) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    af_status st = af_exec_subgraph(x, b, NULL, 0, res, err);
    for (int i = 0; i < n->nout && !st; i++) put(&out[i], &res[i]);
    af_free(res);
    return st;
}

/* ---- Loop -------------------------------------------------------------------------------- */

af_status shape_loop(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    (void)in;
    const af_graph *b = graph_attr(n, "body");
    if (!b) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing body");
    int ncarried = n->nin - 2;
    if (ncarried < 0 || b->ninputs != ncarried + 2 || b->noutputs < ncarried + 1 ||
        n->nout != b->noutputs - 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "body signature (%d inputs, %d outputs) does not match the node",
                            b->ninputs, b->noutputs);
    for (int i = 0; i < n->nout; i++) {
        const af_tensor *bt = body_out(b, i + 1);
        out[i].dtype = bt->dtype;
        out[i].rank = -1;
    }
    return AF_OK;
}

/* Stack per-iteration tensors along a new axis 0. */
static af_status stack(const af_node *n, af_tensor *items, int64_t count, const af_tensor *type,
                       af_tensor *dst, af_error *err) {
    af_tensor t = {0};
    const af_tensor *first = count ? &items[0] : type;
    t.dtype = first->dtype;
    t.rank = (first->rank < 0 ? 0 : first->rank) + 1;
    if (t.rank > AF_MAX_RANK)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "scan output rank too large");
    t.dims[0] = count;
    for (int i = 1; i < t.rank; i++) t.dims[i] = count ? first->dims[i - 1] : (first->dims[i - 1] < 0 ? 0 : first->dims[i - 1]);
    for (int64_t k = 1; k < count; k++) {
        if (items[k].rank != first->rank || memcmp(items[k].dims, first->dims, sizeof first->dims) || items[k].dtype != first->dtype)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "scan output changes shape across iterations");
    }
    af_status st = af_tensor_alloc(&t, err);
    if (st) return st;
    size_t each = count ? items[0].nbytes : 0;
    for (int64_t k = 0; k < count; k++) memcpy((char *)t.data + (size_t)k * each, items[k].data, each);
    put(dst, &t);
    return AF_OK;
}

af_status ref_loop(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                         af_error *err) {
    const af_graph *b = graph_attr(n, "body");
    int ncarried = n->nin - 2, nscan = n->nout - ncarried;
    int64_t trip = n->nin > 0 && in[0] ? af_tensor_get_int(in[0], 0) : INT64_MAX;
    bool cond = n->nin > 1 && in[1] ? scalar_true(in[1]) : true;
    int64_t iters_cap = 0, iters = 0;
    af_tensor *carried = af_calloc((size_t)ncarried + 1, sizeof(af_tensor));
    af_tensor *res = af_calloc((size_t)b->noutputs + 1, sizeof(af_tensor));
    af_tensor **scans = af_calloc((size_t)nscan + 1, sizeof(af_tensor *));
    const af_tensor **args = af_calloc((size_t)b->ninputs + 1, sizeof(af_tensor *));
    af_tensor iter = {0}, cond_t = {0};
    af_status st = AF_OK;
    if (!carried || !res || !scans || !args) {
        st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < ncarried && !st; i++) st = af_tensor_copy(&carried[i], in[2 + i], err);
    iter.dtype = AF_DTYPE_INT64;
    cond_t.dtype = AF_DTYPE_BOOL;
    if (!st) st = af_tensor_alloc(&iter, err);
    if (!st) st = af_tensor_alloc(&cond_t, err);
    for (; !st && iters < trip && cond; iters++) {
        *(int64_t *)iter.data = iters;
        *(uint8_t *)cond_t.data = 1;
        args[0] = &iter;
        args[1] = &cond_t;
        for (int i = 0; i < ncarried; i++) args[2 + i] = &carried[i];
        st = af_exec_subgraph(x, b, args, b->ninputs, res, err);
        if (st) break;
        cond = scalar_true(&res[0]);
        af_tensor_release(&res[0]);
        for (int i = 0; i < ncarried; i++) put(&carried[i], &res[1 + i]);
        if (nscan && iters == iters_cap) {
            int64_t ncap = iters_cap ? iters_cap * 2 : 16;
            for (int k = 0; k < nscan && !st; k++) {
                af_tensor *g = af_realloc(scans[k], (size_t)ncap * sizeof(af_tensor));
                if (!g) st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
                else scans[k] = g;
            }
            if (st) {
                for (int k = 0; k < nscan; k++) af_tensor_release(&res[1 + ncarried + k]);
                break;
            }
            iters_cap = ncap;
        }
        for (int k = 0; k < nscan; k++) {
            scans[k][iters] = res[1 + ncarried + k];
            memset(&res[1 + ncarried + k], 0, sizeof(af_tensor));
        }
    }
    for (int i = 0; i < ncarried && !st; i++) put(&out[i], &carried[i]);
    for (int k = 0; k < nscan && !st; k++)
        st = stack(n, scans[k], iters, body_out(b, 1 + ncarried + k), &out[ncarried + k], err);
done:
    for (int i = 0; carried && i < ncarried; i++) af_tensor_release(&carried[i]);
    for (int k = 0; scans && k < nscan; k++) {
        for (int64_t j = 0; j < iters && scans[k]; j++) af_tensor_release(&scans[k][j]);
        af_free(scans[k]);
    }
    af_tensor_release(&iter);
    af_tensor_release(&cond_t);
    af_free(carried);
    af_free(res);
    af_free(scans);
    af_free(args);
    return st;
}

/* ---- Scan (opset 9+) ------------------------------------------------------------------------ */

typedef struct scan_cfg {
    int nstate, nin_scan, nout_scan;
    int64_t in_axis[AF_MAX_RANK * 4], in_rev[AF_MAX_RANK * 4], out_axis[AF_MAX_RANK * 4],
        out_rev[AF_MAX_RANK * 4];
} scan_cfg;

static af_status scan_config(const af_node *n, const af_graph *b, scan_cfg *c, af_error *err) {
    if (af_graph_opset(n->graph) < 9)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "Scan before opset 9 (batched form) is not supported");
    int64_t m = af_attr_int(n, "num_scan_inputs", -1);
    if (m < 0 || m > n->nin || m > (int64_t)AF_COUNT(c->in_axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad num_scan_inputs");
    c->nin_scan = (int)m;
    c->nstate = n->nin - c->nin_scan;
    c->nout_scan = n->nout - c->nstate;
    if (c->nout_scan < 0 || c->nout_scan > (int)AF_COUNT(c->out_axis) ||
        b->ninputs != n->nin || b->noutputs != n->nout)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "body signature does not match the node");
    const int64_t *v;
    struct { const char *name; int64_t *dst; int count; } lists[] = {
        {"scan_input_axes", c->in_axis, c->nin_scan},
        {"scan_input_directions", c->in_rev, c->nin_scan},
        {"scan_output_axes", c->out_axis, c->nout_scan},
        {"scan_output_directions", c->out_rev, c->nout_scan}};
    for (size_t l = 0; l < AF_COUNT(lists); l++) {
        for (int i = 0; i < lists[l].count; i++) lists[l].dst[i] = 0;
        int k = af_attr_ints(n, lists[l].name, &v);
        if (k < 0) continue;
        if (k != lists[l].count)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s has %d entries, expected %d",
                                lists[l].name, k, lists[l].count);
        for (int i = 0; i < k; i++) lists[l].dst[i] = v[i];
    }
    return AF_OK;
}

af_status shape_scan(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    (void)in;
    const af_graph *b = graph_attr(n, "body");
    if (!b) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing body");
    scan_cfg c;
    af_status st = scan_config(n, b, &c, err);
    if (st) return st;
    for (int i = 0; i < n->nout; i++) {
        out[i].dtype = body_out(b, i)->dtype;
        out[i].rank = -1;
    }
    return AF_OK;
}

/* Copy slice `k` along `axis` of src into dst (dst has src's dims without `axis`), or back. */
static void slice_copy(af_tensor *whole, int axis, int64_t k, af_tensor *part, bool to_whole) {
    size_t es = af_dtype_size(whole->dtype);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; i++) outer *= whole->dims[i];
    for (int i = axis + 1; i < whole->rank; i++) inner *= whole->dims[i];
    int64_t len = whole->dims[axis];
    for (int64_t o = 0; o < outer; o++) {
        char *w = (char *)whole->data + ((size_t)(o * len + k) * (size_t)inner) * es;
        char *p = (char *)part->data + (size_t)(o * inner) * es;
        if (to_whole) memcpy(w, p, (size_t)inner * es);
        else memcpy(p, w, (size_t)inner * es);
    }
}

af_status ref_scan(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                         af_error *err) {
    const af_graph *b = graph_attr(n, "body");
    scan_cfg c;
    af_status st = scan_config(n, b, &c, err);
    if (st) return st;
    int ns = c.nstate, m = c.nin_scan, k = c.nout_scan;
    int in_ax[AF_MAX_RANK * 4];
    int64_t len = -1;
    for (int j = 0; j < m; j++) {
        const af_tensor *t = in[ns + j];
        if (!af_axis(c.in_axis[j], t->rank, &in_ax[j]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "scan_input_axes out of range");
        if (len >= 0 && t->dims[in_ax[j]] != len)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "scan inputs have different lengths");
        len = t->dims[in_ax[j]];
    }
    if (len < 0) len = 0;
    af_tensor *state = af_calloc((size_t)ns + 1, sizeof(af_tensor));
    af_tensor *slices = af_calloc((size_t)m + 1, sizeof(af_tensor));
    af_tensor *res = af_calloc((size_t)n->nout + 1, sizeof(af_tensor));
    const af_tensor **args = af_calloc((size_t)n->nin + 1, sizeof(af_tensor *));
    int out_ax[AF_MAX_RANK * 4];
    if (!state || !slices || !res || !args) {
        st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < ns && !st; i++) st = af_tensor_copy(&state[i], in[i], err);
    for (int j = 0; j < m && !st; j++) {
        const af_tensor *t = in[ns + j];
        slices[j].dtype = t->dtype;
        slices[j].rank = t->rank - 1;
        for (int d = 0, e = 0; d < t->rank; d++)
            if (d != in_ax[j]) slices[j].dims[e++] = t->dims[d];
        st = af_tensor_alloc(&slices[j], err);
    }
    for (int64_t it = 0; it < len && !st; it++) {
        for (int j = 0; j < m; j++) {
            int64_t pos = c.in_rev[j] ? len - 1 - it : it;
            slice_copy((af_tensor *)in[ns + j], in_ax[j], pos, &slices[j], false);
        }
        for (int i = 0; i < ns; i++) args[i] = &state[i];
        for (int j = 0; j < m; j++) args[ns + j] = &slices[j];
        st = af_exec_subgraph(x, b, args, n->nin, res, err);
        if (st) break;
        for (int i = 0; i < ns; i++) put(&state[i], &res[i]);
        for (int q = 0; q < k && !st; q++) {
            af_tensor *piece = &res[ns + q], *whole = &out[ns + q];
            if (it == 0) {
                af_tensor w = {0};
                w.dtype = piece->dtype;
                w.rank = piece->rank + 1;
                if (w.rank > AF_MAX_RANK || !af_axis(c.out_axis[q], w.rank, &out_ax[q])) {
                    st = af_node_fail(err, n, AF_ERR_INVALID_MODEL, "scan_output_axes out of range");
                    break;
                }
                for (int d = 0, e = 0; d < w.rank; d++) w.dims[d] = d == out_ax[q] ? len : piece->dims[e++];
                st = af_tensor_alloc(&w, err);
                if (!st) put(whole, &w);
            } else if (piece->nbytes * (size_t)len != whole->nbytes) {
                st = af_node_fail(err, n, AF_ERR_RUNTIME, "scan output changes shape across iterations");
            }
            if (!st) slice_copy(whole, out_ax[q], c.out_rev[q] ? len - 1 - it : it, piece, true);
        }
        for (int q = 0; q < k; q++) af_tensor_release(&res[ns + q]);
    }
    for (int i = 0; i < ns && !st; i++) put(&out[i], &state[i]);
    for (int q = 0; q < k && !st && len == 0; q++) {
        af_tensor w = {0};
        w.dtype = body_out(b, ns + q)->dtype;
        w.rank = 1;
        st = af_tensor_alloc(&w, err);
        if (!st) put(&out[ns + q], &w);
    }
done:
    for (int i = 0; state && i < ns; i++) af_tensor_release(&state[i]);
    for (int j = 0; slices && j < m; j++) af_tensor_release(&slices[j]);
    for (int i = 0; res && i < n->nout; i++) af_tensor_release(&res[i]);
    af_free(state);
    af_free(slices);
    af_free(res);
    af_free(args);
    return st;
}
