/* Symbolic dims (ir.h): a dynamic dim is a product c * s1 * ... * sk of the model's named dims
 * (dim_param, or a fresh name for an unnamed one), interned in the top-level graph's table and
 * written into dims[] as -2 - (its index). So shape code that copies or compares dims needs no
 * change, and code that guards arithmetic with `d < 0` stays correct: it only loses the symbol.
 *
 * Invariant: one product has one index (factors sorted, coefficient > 1 or factors > 1 or a
 * named leaf), so two dims are the same size exactly when their numbers are equal; a product
 * without factors is a plain number, never an entry. Products are exact; a sum of two dims
 * (af_dim_add) is a leaf of its own, named "(a+b)" with its terms kept, so that subtracting one
 * term gives the other back (past + new - new is past: the key length of attention with past
 * keys). A floor-division, a product of more than AF_SYM_FACTORS factors or any other sum
 * becomes AF_DIM_UNKNOWN. Two sum leaves may stand for the same size under different names
 * ((a+b)+c, a+(b+c)); equal numbers are still equal sizes, which is all shape code relies on. */
#include "ir/ir.h"

#include <stdio.h>
#include <string.h>

enum { AF_SYM_FACTORS = 4 };

typedef struct sym {
    int64_t coef;
    int n;                      /* factors */
    int leaf[AF_SYM_FACTORS];   /* entry indices of leaves, ascending */
    const char *name;           /* leaves only */
    int64_t term[2];            /* a sum leaf's two terms (dims), else 0 */
} sym;

struct af_symtab {
    sym *e;
    int n, cap;
    int fresh; /* counter for unnamed dims */
};

static af_graph *root(const af_graph *g) {
    while (g->parent) g = g->parent;
    return (af_graph *)g;
}

static af_symtab *table(af_graph *g) {
    g = root(g);
    if (!g->syms) g->syms = af_arena_calloc(g->arena, 1, sizeof *g->syms);
    return g->syms;
}

static int64_t code(int idx) { return -2 - (int64_t)idx; }

/* The entry for (coef, factors), added when new; AF_DIM_UNKNOWN when out of memory. */
static int64_t intern(af_graph *g, const sym *s) {
    if (s->n == 0) return s->coef;
    af_symtab *t = table(g);
    if (!t) return AF_DIM_UNKNOWN;
    for (int i = 0; i < t->n; i++) {
        const sym *e = &t->e[i];
        if (!e->name && e->coef == s->coef && e->n == s->n &&
            !memcmp(e->leaf, s->leaf, sizeof(int) * (size_t)s->n))
            return code(i);
    }
    /* A leaf times 1 is the leaf itself. */
    if (s->coef == 1 && s->n == 1) return code(s->leaf[0]);
    if (!af_arena_grow(root(g)->arena, (void **)&t->e, &t->cap, t->n + 1, sizeof *t->e))
        return AF_DIM_UNKNOWN;
    t->e[t->n] = *s;
    t->e[t->n].name = NULL;
    return code(t->n++);
}

/* d as a product; false for AF_DIM_UNKNOWN or a number outside the table. */
static bool decompose(const af_graph *g, int64_t d, sym *out) {
    memset(out, 0, sizeof *out);
    if (d >= 0) {
        out->coef = d;
        return true;
    }
    const af_symtab *t = root(g)->syms;
    int64_t i = -2 - d;
    if (d == AF_DIM_UNKNOWN || !t || i >= t->n) return false;
    *out = t->e[i];
    if (out->name) { /* a leaf stands for itself */
        out->coef = 1;
        out->n = 1;
        out->leaf[0] = (int)i;
        out->name = NULL;
        out->term[0] = out->term[1] = 0;
    }
    return true;
}

int64_t af_dim_named(af_graph *g, const char *name) {
    af_symtab *t = table(g);
    if (!t) return AF_DIM_UNKNOWN;
    char buf[32];
    if (!name || !*name) {
        snprintf(buf, sizeof buf, "unk__%d", t->fresh++);
        name = buf;
    } else {
        for (int i = 0; i < t->n; i++)
            if (t->e[i].name && !strcmp(t->e[i].name, name)) return code(i);
    }
    const char *copy = af_arena_strdup(root(g)->arena, name);
    if (!copy || !af_arena_grow(root(g)->arena, (void **)&t->e, &t->cap, t->n + 1, sizeof *t->e))
        return AF_DIM_UNKNOWN;
    t->e[t->n] = (sym){.coef = 1, .n = 1, .leaf = {t->n}, .name = copy};
    return code(t->n++);
}

int64_t af_dim_mul(af_graph *g, int64_t a, int64_t b) {
    if (a == 0 || b == 0) return 0;
    sym x = {0}, y = {0}, r = {0};
    if (!decompose(g, a, &x) || !decompose(g, b, &y)) return AF_DIM_UNKNOWN;
    if (!af_mul_i64(x.coef, y.coef, &r.coef) || x.n + y.n > AF_SYM_FACTORS)
        return AF_DIM_UNKNOWN;
    int i = 0, j = 0;
    while (i < x.n || j < y.n) /* merge the two ascending factor lists */
        r.leaf[r.n++] = j >= y.n || (i < x.n && x.leaf[i] <= y.leaf[j]) ? x.leaf[i++] : y.leaf[j++];
    return intern(g, &r);
}

int64_t af_dim_div(af_graph *g, int64_t a, int64_t b) {
    sym x = {0}, y = {0};
    if (b == 0 || !decompose(g, a, &x) || !decompose(g, b, &y)) return AF_DIM_UNKNOWN;
    if (x.coef % y.coef) return AF_DIM_UNKNOWN;
    sym r = {.coef = x.coef / y.coef};
    int j = 0;
    for (int i = 0; i < x.n && i < AF_SYM_FACTORS; i++) { /* x's minus y's (both ascending) */
        if (j < y.n && x.leaf[i] == y.leaf[j]) j++;
        else r.leaf[r.n++] = x.leaf[i];
    }
    return j == y.n ? intern(g, &r) : AF_DIM_UNKNOWN;
}

/* The sum leaf a+b (a <= b as numbers, so a+b and b+a are one leaf). */
static int64_t sum_leaf(af_graph *g, int64_t a, int64_t b) {
    char sa[96], sb[96], name[200];
    if (a > b) {
        int64_t t = a;
        a = b;
        b = t;
    }
    af_dim_str(g, a, sa, sizeof sa);
    af_dim_str(g, b, sb, sizeof sb);
    if (snprintf(name, sizeof name, "(%s+%s)", sa, sb) >= (int)sizeof name) return AF_DIM_UNKNOWN;
    int64_t d = af_dim_named(g, name);
    if (d == AF_DIM_UNKNOWN) return d;
    sym *e = &table(g)->e[-2 - d];
    e->term[0] = a;
    e->term[1] = b;
    return d;
}

int64_t af_dim_add(af_graph *g, int64_t a, int64_t b) {
    int64_t r;
    if (a == AF_DIM_UNKNOWN || b == AF_DIM_UNKNOWN) return AF_DIM_UNKNOWN;
    if (a >= 0 && b >= 0) return af_add_i64(a, b, &r) ? r : AF_DIM_UNKNOWN;
    if (a == 0) return b;
    if (b == 0) return a;
    return sum_leaf(g, a, b);
}

int64_t af_dim_sub(af_graph *g, int64_t a, int64_t b) {
    if (a == AF_DIM_UNKNOWN || b == AF_DIM_UNKNOWN) return AF_DIM_UNKNOWN;
    if (a >= 0 && b >= 0) return a >= b ? a - b : AF_DIM_UNKNOWN;
    if (b == 0 || a == b) return a == b ? 0 : a;
    const af_symtab *t = root(g)->syms;
    int64_t i = -2 - a;
    if (a >= 0 || !t || i >= t->n || !t->e[i].name || (!t->e[i].term[0] && !t->e[i].term[1]))
        return AF_DIM_UNKNOWN;
    const sym *e = &t->e[i];
    return e->term[0] == b ? e->term[1] : e->term[1] == b ? e->term[0] : AF_DIM_UNKNOWN;
}

int64_t af_dims_product(af_graph *g, const int64_t *dims, int n) {
    int64_t p = 1;
    for (int i = 0; i < n && p != AF_DIM_UNKNOWN; i++) p = af_dim_mul(g, p, dims[i]);
    return p;
}

bool af_dims_defined(const af_tensor *t) {
    if (!t || t->rank < 0) return false;
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i] == AF_DIM_UNKNOWN) return false;
    return true;
}

const char *af_dim_str(const af_graph *g, int64_t d, char *buf, size_t len) {
    sym s;
    if (!g || !decompose(g, d, &s) || !len) {
        snprintf(buf, len, "%s", d == AF_DIM_UNKNOWN ? "?" : "?sym");
        return buf;
    }
    const af_symtab *t = root(g)->syms;
    size_t at = 0;
    if (s.coef != 1 || !s.n) at = (size_t)snprintf(buf, len, "%lld", (long long)s.coef);
    for (int i = 0; i < s.n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? "*" : "", t->e[s.leaf[i]].name);
    return buf;
}

af_status af_graph_name_input_dims(af_graph *g, af_error *err) {
    for (int i = 0; i < g->ninputs; i++) {
        af_value *v = g->inputs[i];
        for (int d = 0; !v->is_const && d < v->type.rank; d++) {
            if (v->type.dims[d] != AF_DIM_UNKNOWN) continue;
            if ((v->type.dims[d] = af_dim_named(g, v->dim_param[d])) == AF_DIM_UNKNOWN)
                return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", g->file ? g->file : "<model>");
        }
    }
    return AF_OK;
}
