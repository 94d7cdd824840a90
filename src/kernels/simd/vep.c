/* The epilogue program in the form the vector kernels run (vec.h: af_vep): each binary operand
 * classified by how it broadcasts over the output seen as rows x cols, and the reference epilogue
 * kept for operands that fit no kind.
 *
 * Invariant: an operand classified into a kind is read only inside the range that kind
 * describes; the rest stays with the reference epilogue. */
#include "kernels/simd/vec.h"

/* How a binary operand with broadcast strides s (over the output's dims) reads the rows x cols
 * view of the output; AF_VEP_NONE when it fits none of the kinds. */
static int vep_kind(const af_epilogue *ep, const int64_t *s) {
    int r = ep->rank;
    bool zero = true, dense = true, rowwise = true;
    int64_t want = 1, want_row = 1;
    for (int i = r - 1; i >= 0; i--) {
        if (ep->dims[i] == 1) continue; /* any stride works along a dim of 1 */
        if (s[i] != 0) zero = false;
        if (s[i] != want) dense = false;
        if (i < r - 1 && s[i] != want_row) rowwise = false;
        want *= ep->dims[i];
        if (i < r - 1) want_row *= ep->dims[i];
    }
    int64_t last = ep->dims[r - 1] == 1 ? 0 : s[r - 1];
    if (zero) return AF_VEP_SCALAR;
    if (dense) return AF_VEP_FULL;
    if (last == 1) {
        bool lead_zero = true;
        for (int i = 0; i < r - 1; i++)
            if (ep->dims[i] != 1 && s[i] != 0) lead_zero = false;
        if (lead_zero) return AF_VEP_COL;
    }
    if (last == 0 && rowwise) return AF_VEP_ROW;
    return AF_VEP_NONE;
}

void af_vep_build(const af_epilogue *ep, float *y, int64_t cols, af_vep *v) {
    memset(v, 0, offsetof(af_vep, steps));
    v->cols = cols;
    v->y = y;
    for (int s = 0; ep && s < ep->nsteps; s++) {
        const af_ep_step *st = &ep->steps[s];
        af_vep_step *o = &v->steps[s];
        o->op = st->op;
        o->rev = st->reversed;
        o->p0 = st->p0;
        o->p1 = st->p1;
        o->x = st->operand;
        o->kind = AF_VEP_NONE;
        if (st->operand) o->kind = ep->rank == 0 ? AF_VEP_SCALAR : vep_kind(ep, st->strides);
        if (st->operand && o->kind == AF_VEP_NONE) v->generic = ep;
        /* A plugin's function runs on arrays: the reference epilogue calls it per run. */
        if (st->custom) v->generic = ep;
    }
    v->nsteps = v->generic || !ep ? 0 : ep->nsteps;
}

void af_vep_prepend(af_vep *v, int op, int kind, const float *x) {
    AF_ASSERT(v->nsteps < AF_VEP_MAX_STEPS);
    memmove(v->steps + 1, v->steps, (size_t)v->nsteps * sizeof v->steps[0]);
    v->steps[0] = (af_vep_step){op, kind, 0, 0.0f, 0.0f, x};
    v->nsteps++;
}
