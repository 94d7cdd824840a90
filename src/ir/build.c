/* Building blocks for the passes and the fusion rules that rewrite the graph: queries about a
 * value (a true constant, the sole reader), setting attributes, new float32 constants and new
 * nodes of our domain. All memory comes from the graph's arena.
 *
 * Invariant: a function that fails (out of memory) reports it (false or NULL) and leaves the
 * graph as it was. */
#include "ir/ir.h"

#include <string.h>

bool af_value_is_const(const af_value *v) {
    if (!v || !v->is_const || v->is_input || !v->type.data) return false;
    int64_t numel = af_tensor_numel(&v->type);
    size_t need;
    return numel >= 0 && af_mul_size((size_t)numel, af_dtype_size(v->type.dtype), &need) &&
           v->type.nbytes >= need;
}

bool af_value_is_f32(const af_value *v) {
    return v && v->type.dtype == AF_DTYPE_FLOAT;
}

af_node *af_value_sole_reader(const af_value *v) {
    if (!v || v->nuses != 1) return NULL;
    af_node *r = v->uses[0].node;
    return r->graph == v->graph ? r : NULL;
}

af_node *af_node_new_ours(af_graph *g, af_op op, const char *name, int nin) {
    af_node *n = af_node_new(g, op, name, nin, 1);
    if (n) n->domain = AF_DOMAIN;
    return n;
}

bool af_node_set_int(af_node *n, const char *name, int64_t v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_INT);
    if (a) a->i = v;
    return a != NULL;
}

bool af_node_set_str(af_node *n, const char *name, const char *v) {
    size_t len = strlen(v);
    char *copy = af_arena_strndup(n->graph->arena, v, len);
    af_attr *a = NULL;
    for (int i = 0; i < n->nattrs && !a; i++)
        if (!strcmp(n->attrs[i].name, name) && n->attrs[i].type == AF_ATTR_STRING) a = &n->attrs[i];
    if (!a && copy) a = af_node_add_attr(n, name, AF_ATTR_STRING);
    if (!a || !copy) return false;
    a->s = copy;
    a->slen = len;
    return true;
}

bool af_node_set_float(af_node *n, const char *name, float v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_FLOAT);
    if (a) a->f = v;
    return a != NULL;
}

bool af_node_set_ints(af_node *n, const char *name, const int64_t *v, int count) {
    int64_t *copy = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(int64_t));
    af_attr *a = copy ? af_node_add_attr(n, name, AF_ATTR_INTS) : NULL;
    if (!a) return false;
    memcpy(copy, v, (size_t)count * sizeof(int64_t));
    a->ints = copy;
    a->n = count;
    return true;
}

void af_node_drop_attr(af_node *n, const char *name) {
    for (int i = 0; i < n->nattrs; i++)
        if (!strcmp(n->attrs[i].name, name)) {
            n->attrs[i] = n->attrs[--n->nattrs];
            return;
        }
}

bool af_node_set_floats(af_node *n, const char *name, const float *v, int count) {
    float *copy = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(float));
    af_attr *a = copy ? af_node_add_attr(n, name, AF_ATTR_FLOATS) : NULL;
    if (!a) return false;
    memcpy(copy, v, (size_t)count * sizeof(float));
    a->floats = copy;
    a->n = count;
    return true;
}

af_value *af_value_new_f32(af_graph *g, const char *hint, int rank, const int64_t *dims) {
    const char *name = af_graph_unique_name(g, hint);
    return name ? af_value_new_const(g, name, AF_DTYPE_FLOAT, rank, dims) : NULL;
}

bool af_reshape_shape(const af_tensor *from, const af_tensor *to, int64_t *shape) {
    if (from->rank < 0 || to->rank < 0 || to->rank > AF_MAX_RANK) return false;
    int infer = -1;
    for (int i = 0; i < to->rank; i++) {
        int64_t d = to->dims[i];
        bool same = i < from->rank && from->dims[i] == d;
        if (d > 0) shape[i] = d;
        else if (same && d != AF_DIM_UNKNOWN) shape[i] = 0; /* copy: a 0, or the same symbol */
        else if (af_dim_is_sym(d) && infer < 0) shape[i] = -1, infer = i;
        else return false;
    }
    return true;
}

af_value *af_value_new_ints(af_graph *g, const char *hint, int n, const int64_t *values) {
    int64_t len = n;
    const char *name = af_graph_unique_name(g, hint);
    af_value *c = name ? af_value_new_const(g, name, AF_DTYPE_INT64, 1, &len) : NULL;
    if (c && n) memcpy(c->type.data, values, sizeof(int64_t) * (size_t)n);
    return c;
}

af_value *af_value_new_reshape_shape(af_graph *g, const af_tensor *from, const af_tensor *to) {
    int64_t shape[AF_MAX_RANK];
    return af_reshape_shape(from, to, shape) ? af_value_new_ints(g, "shape", to->rank, shape) : NULL;
}
