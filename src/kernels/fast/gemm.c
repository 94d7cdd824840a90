/* The GEMM driver (see gemm.h): packing, blocking, the split over threads, the micro-kernel
 * calls and the epilogue on each tile.
 *
 * Invariant: every micro-kernel call reads A rows [m, m + mr) and B rows [0, K) of one panel,
 * and writes either C (when all its columns are inside N) or a local tile that is then copied
 * into C's valid columns, so nothing is ever written past column N. */
#include "kernels/fast/gemm.h"
#include "kernels/simd/amx.h"
#include "kernels/simd/cpu.h"
#include "util/util.h"

#include <math.h>
#include <string.h>

/* ---- packing ---------------------------------------------------------------------------------------- */

/* Width of panel p of an N-column matrix. */
static int64_t panel_width(int64_t n, int64_t p) {
    int64_t left = n - p * AF_GEMM_NR;
    return left > AF_GEMM_NR / 2 ? AF_GEMM_NR : AF_GEMM_NR / 2;
}

size_t af_gemm_packed_floats(int64_t k, int64_t n) {
    if (k <= 0 || n <= 0) return 0;
    int64_t np = (n + AF_GEMM_NR - 1) / AF_GEMM_NR;
    return (size_t)k * (size_t)((np - 1) * AF_GEMM_NR + panel_width(n, np - 1));
}

/* Panel by panel; the loops run along whichever of B's dims is contiguous (row copies, or a
 * column read down at a time for a transposed B: attention packs K^T per head at run time). */
void af_gemm_pack(const float *b, int64_t k, int64_t n, int64_t sk, int64_t sn, float *dst) {
    int64_t np = (n + AF_GEMM_NR - 1) / AF_GEMM_NR;
    for (int64_t p = 0; p < np; p++) {
        int64_t w = panel_width(n, p), j0 = p * AF_GEMM_NR, valid = n - j0 < w ? n - j0 : w;
        float *d = dst + j0 * k;
        if (sn == 1 || sk != 1) {
            for (int64_t kk = 0; kk < k; kk++) {
                for (int64_t j = 0; j < valid; j++) d[kk * w + j] = b[kk * sk + (j0 + j) * sn];
                for (int64_t j = valid; j < w; j++) d[kk * w + j] = 0.0f;
            }
            continue;
        }
        for (int64_t j = 0; j < w; j++)
            for (int64_t kk = 0; kk < k; kk++) d[kk * w + j] = j < valid ? b[kk + (j0 + j) * sn] : 0.0f;
    }
}

int64_t af_gemm_bf16_k(int64_t k) {
    return (k + AF_GEMM_BF16_KB - 1) / AF_GEMM_BF16_KB * AF_GEMM_BF16_KB;
}

int64_t af_gemm_u8s8_k(int64_t k) {
    return (k + AF_GEMM_U8S8_KB - 1) / AF_GEMM_U8S8_KB * AF_GEMM_U8S8_KB;
}

size_t af_gemm_packed_bytes(af_gemm_type t, int64_t k, int64_t n) {
    if (t == AF_GEMM_U8S8) /* the quads, then one column sum per panel column */
        return 4 * (af_gemm_packed_floats(af_gemm_u8s8_k(k) / 4, n) + af_gemm_packed_floats(1, n));
    size_t f = af_gemm_packed_floats(t == AF_GEMM_BF16 ? af_gemm_bf16_k(k) / 2 : k, n);
    return t == AF_GEMM_F16 ? 2 * f : 4 * f;
}

const int32_t *af_gemm_u8s8_colsum(const void *packed, int64_t k, int64_t n) {
    return (const int32_t *)((const char *)packed +
                             4 * af_gemm_packed_floats(af_gemm_u8s8_k(k) / 4, n));
}

bool af_gemm_int8_7bit(const int8_t *w, int64_t count) {
    for (int64_t i = 0; i < count; i++)
        if (w[i] < -64 || w[i] > 64) return false;
    return true;
}

void af_gemm_pack_u8s8(const int8_t *b, int64_t k, int64_t n, int64_t sk, int64_t sn, void *dst) {
    int64_t np = (n + AF_GEMM_NR - 1) / AF_GEMM_NR, rows = af_gemm_u8s8_k(k) / 4;
    int8_t *d = dst;
    int32_t *colsum = (int32_t *)(d + 4 * af_gemm_packed_floats(rows, n));
    for (int64_t p = 0; p < np; p++) {
        int64_t w = panel_width(n, p), j0 = p * AF_GEMM_NR;
        int8_t *dp = d + 4 * j0 * rows;
        for (int64_t j = 0; j < w; j++) colsum[j0 + j] = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < w; j++)
                for (int64_t i = 0; i < 4; i++) {
                    int64_t kk = 4 * r + i;
                    int8_t v = j0 + j < n && kk < k ? b[kk * sk + (j0 + j) * sn] : 0;
                    *dp++ = v;
                    colsum[j0 + j] += v;
                }
    }
}

void af_gemm_pack_type(af_gemm_type t, const float *b, int64_t k, int64_t n, int64_t sk,
                       int64_t sn, void *dst) {
    if (t == AF_GEMM_F32) {
        af_gemm_pack(b, k, n, sk, sn, dst);
        return;
    }
    int64_t np = (n + AF_GEMM_NR - 1) / AF_GEMM_NR;
    int64_t rows = t == AF_GEMM_BF16 ? af_gemm_bf16_k(k) / 2 : k;
    uint16_t *d = dst;
    for (int64_t p = 0; p < np; p++) {
        int64_t w = panel_width(n, p), j0 = p * AF_GEMM_NR;
        uint16_t *dp = d + (t == AF_GEMM_BF16 ? 2 : 1) * j0 * rows;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < w; j++) {
                bool in = j0 + j < n;
                if (t == AF_GEMM_F16) {
                    *dp++ = af_float_to_half(in ? b[r * sk + (j0 + j) * sn] : 0.0f);
                    continue;
                }
                float lo = in && 2 * r < k ? b[2 * r * sk + (j0 + j) * sn] : 0.0f;
                float hi = in && 2 * r + 1 < k ? b[(2 * r + 1) * sk + (j0 + j) * sn] : 0.0f;
                *dp++ = af_float_to_bf16(lo);
                *dp++ = af_float_to_bf16(hi);
            }
    }
}

/* ---- the driver ----------------------------------------------------------------------------------- */

/* How far ahead (in B rows) the micro-kernels prefetch B: about 6 KB of a 32-wide panel,
 * beyond the distance memory latency covers at their pace. Every tile does it: measured
 * (gemm_bench --cold), that beats one tile fetching for the others. */
#define PREFETCH_ROWS 48

/* The part of the epilogue the micro-kernels apply in registers: a leading bias (ADD of a
 * column vector), then a residual (ADD of a full-size operand), then a Relu or Clip (a maxps
 * and a minps per register); `rest` is what follows, applied to the stored tile while it is in
 * L1 (other activations too: ep_tile runs each step over the whole tile with its constants in
 * registers, which measured faster than calling the activation on every register of the tile).
 * On the stored tile, a Relu cost a 1x1 conv to 256 channels at 56x56 67-84 us over the same
 * conv without it (861 us; `bench --compare --profile` node times), in registers 22-31 us. */
typedef struct reg_ep {
    const float *bias, *res;
    bool clamped;
    float clamp[2];
    af_reg_prog prog; /* one K block only: the longer start (vec.h af_reg_prog), or n = 0 */
    af_vep rest;
} reg_ep;

/* A step the register program takes: a residual (once), Relu, Clip or a fake quantization. */
static bool reg_step(const af_vep_step *st, const reg_ep *r) {
    return st->kind == AF_VEP_NONE ? st->op == AF_EP_RELU || st->op == AF_EP_CLIP || st->op == AF_EP_FAKE_QUANT
                                   : st->op == AF_EP_ADD && st->kind == AF_VEP_FULL && !r->res;
}

/* v's start for the micro-kernels: the bias, then, for a GEMM in one K block (not `blocked`),
 * the longest run of register steps (af_reg_prog), else a residual and a Relu or Clip in that
 * order (the partial sums of K blocks take the residual's place, and the clamp waits for the
 * last block). */
static void split_ep(const af_vep *v, reg_ep *r, bool blocked) {
    memset(r, 0, offsetof(reg_ep, rest));
    int s = 0;
    if (v && !v->generic) {
        const af_vep_step *st = v->steps;
        if (s < v->nsteps && st[s].op == AF_EP_ADD && st[s].kind == AF_VEP_COL) r->bias = st[s++].x;
        if (!blocked) {
            for (; s < v->nsteps && r->prog.n < AF_REG_MAX && reg_step(&st[s], r); s++) {
                if (st[s].kind == AF_VEP_FULL) r->res = st[s].x;
                r->prog.s[r->prog.n].op = st[s].op;
                r->prog.s[r->prog.n].p0 = st[s].p0;
                r->prog.s[r->prog.n++].p1 = st[s].p1;
            }
        } else {
            if (s < v->nsteps && st[s].op == AF_EP_ADD && st[s].kind == AF_VEP_FULL) r->res = st[s++].x;
            if (s < v->nsteps && (st[s].op == AF_EP_RELU || st[s].op == AF_EP_CLIP)) {
                r->clamped = true;
                r->clamp[0] = st[s].op == AF_EP_RELU ? 0.0f : st[s].p0;
                r->clamp[1] = st[s].op == AF_EP_RELU ? INFINITY : st[s].p1;
                s++;
            }
        }
    }
    memset(&r->rest, 0, offsetof(af_vep, steps));
    if (!v) return;
    r->rest.cols = v->cols;
    r->rest.y = v->y;
    r->rest.generic = v->generic;
    r->rest.nsteps = v->nsteps - s;
    memcpy(r->rest.steps, v->steps + s, sizeof(af_vep_step) * (size_t)r->rest.nsteps);
}

typedef struct gemm_job {
    const af_gemm *g;
    const af_vec_ops *v;
    const int32_t *colsum;     /* U8S8: B's column sums (after its panels) */
    int64_t k, npanels, block; /* rows of a packed panel (K, or K / 2 pairs); panels per block */
    int64_t nblocks;
    int64_t tiles_per_row;     /* M tiles per outer index o */
    int64_t ntiles;
    int64_t part_tiles;        /* M tiles per part (the last part may have fewer) */
    bool amx;                  /* BF16 on AMX: tiles of 32 rows, blocks by af_amx_block */
    /* one of several K blocks (gemm_k_blocks): acc, C holds the product of the blocks before
     * (added here; the bias and residual came with the first); partial, blocks follow (no
     * clamp and no further epilogue steps yet) */
    bool acc, partial;
    reg_ep rep;
    /* Per slot, kept across its pieces of the range (af_exec_parallel): 1 + the block it last
     * ran, counted over parts (0: none, so the zeroed job starts with none; with b_rowscale its
     * scratch holds that block scaled) and its first tile there. */
    int64_t cur[AF_EXEC_MAX_SLOTS], first[AF_EXEC_MAX_SLOTS];
} gemm_job;

/* Tile t: outer index o, first inner row i0 and row count. Balanced for the vector kernels;
 * whole 32-row tiles first on AMX, whose blocks compute 16 or 32 rows anyway. */
static void tile_rows(const gemm_job *j, int64_t t, int64_t *o, int64_t *i0, int64_t *mr) {
    int64_t mi = j->g->mi, tpr = j->tiles_per_row, q = t % tpr;
    *o = t / tpr;
    if (j->amx) {
        *i0 = 32 * q;
        *mr = mi - *i0 < 32 ? mi - *i0 : 32;
        return;
    }
    *i0 = mi * q / tpr;
    *mr = mi * (q + 1) / tpr - *i0;
}

static bool has_steps(const af_vep *v) {
    return v && (v->nsteps || v->generic);
}

/* What a (tile, panel) item brings in while it computes. Blocks of B come from memory when
 * there are several (a layer's weights larger than an eighth of the L2). A thread's first tile
 * in a block reads that block's panels cold, and prefetches them some rows ahead; every later
 * tile of the block fetches one slice of the next block, spread evenly over its K loop (a line
 * every few k steps), so that block is in L2 when the thread gets to it. Before, only the first
 * tile fetched, and at one core's memory bandwidth it took 2.5x as long as the others
 * (gemm_bench --cold, 197x2304x768: 10% of the whole GEMM). Bunching the slice's prefetches at
 * the start of the K loop instead measured slower than no slices: more lines in flight than
 * the fill buffers hold stalls the loads the FMAs wait on. */
typedef struct item_pf {
    int64_t blk, tile; /* block, and M tile index (the items of a block run tile by tile) */
    int64_t first;     /* this thread's first tile in the block */
    int64_t end;       /* the end of the part's tiles */
    const char *bblk;  /* NULL, or where this thread keeps the block scaled (b_rowscale) */
} item_pf;

/* The piece of the next block of B that item ip (panel p) fetches while it computes: the
 * block's panels in equal pieces, as many per panel as the thread's items after its first tile
 * in this block allow (a thread that came in halfway through the block, as the one after a
 * split does, still fetches all of it), each spread over the K loop. With a range of B's rows
 * (kp: the K blocks) only the rows [k0, k0 + rows) of each panel: fetching none there, the
 * first tile of each block waited on memory, 197 and 50 x 768 x 3072 with B from memory
 * (gemm_bench --cold, in-process A/B) ran 1-11% slower, in cache 0-13%. */
static void next_block_piece(const gemm_job *j, const item_pf *ip, int64_t p, int64_t eb, af_ukr_args *u) {
    const af_gemm *g = j->g;
    int64_t p0 = ip->blk * j->block, bl = j->npanels - p0 < j->block ? j->npanels - p0 : j->block;
    int64_t q0 = p0 + bl, nq = j->npanels - q0 < j->block ? j->npanels - q0 : j->block;
    int64_t rows = g->kp ? g->ntaps * g->tap_len : j->k; /* B rows read = K loop steps */
    int64_t per = (ip->end - 1 - ip->first) * bl / nq, s = (ip->tile - ip->first - 1) * bl + (p - p0);
    if (per < 1) per = 1;
    int64_t q = q0 + s / per;
    if (q >= q0 + nq) return;
    int64_t w = panel_width(g->n, q), bytes = rows * w * eb, piece = (bytes + per - 1) / per;
    int64_t from = s % per * piece, len = bytes - from < piece ? bytes - from : piece;
    u->pf = (const char *)g->b + (q * AF_GEMM_NR * j->k + g->k0 * w) * eb + from;
    u->pf_step = (piece + rows - 1) / rows;
    u->pf_steps = len > 0 ? (len + u->pf_step - 1) / u->pf_step : 0;
    if (u->pf_steps > rows) u->pf_steps = rows;
}

/* Most rows of an item (gemm_group's tiles) when the output is codes. */
#define CODES_ROWS (8 * AF_GEMM_MR_MAX)

/* Where run_panel's micro-kernels put their tiles: floats at c (ldc apart), or, converted in
 * their registers, codes at codes (ldc apart; c NULL). */
typedef struct panel_out {
    float *c;
    uint8_t *codes;
    int64_t ldc;
} panel_out;

/* The micro-kernel calls of run_panel (below) into o. Inlined in run_panel and panel_tiled:
 * as a function of its own between gemm_range and the micro-kernels, float32 ResNet-50 and
 * MobileNet-v2 ran 1% slower (6 interleaved rounds). */
static inline __attribute__((always_inline)) void panel_products(const gemm_job *j, const void *a,
                                                                 int64_t m, int64_t rows, int64_t p,
                                                                 const item_pf *ip, panel_out o) {
    const af_gemm *g = j->g;
    const af_vec_ops *v = j->v;
    const reg_ep *re = &j->rep;
    int64_t w = panel_width(g->n, p), j0 = p * AF_GEMM_NR;
    int64_t valid = g->n - j0 < w ? g->n - j0 : w;
    int64_t row = g->ep_row0 + m, ld = g->ep ? g->ep->cols : 0;
    /* Bytes per element of B (a 32-bit word per column and pair of rows for BF16, quad of rows
     * for U8S8) and of A. */
    int64_t eb = g->type == AF_GEMM_F16 ? 2 : 4;
    int64_t ea = g->type == AF_GEMM_BF16 ? 2 : g->type == AF_GEMM_U8S8 ? 1 : 4;
    const char *panel = ip && ip->bblk ? ip->bblk + (p - ip->blk * j->block) * AF_GEMM_NR * j->k * eb
                                       : (const char *)g->b + (j0 * j->k + g->k0 * w) * eb;
    af_ukr_args u = {a, g->rs_i, g->tap_off, g->ntaps, g->tap_len, NULL, w, NULL, o.ldc,
                     NULL, NULL, 0, NULL, NULL, 0, 0, 0, NULL, NULL, 0, 0, NULL, NULL, 0.0f, 0};
    /* All of B stays in cache: each tile brings in the next tile's rows of A instead
     * (contiguous here) while it runs the first panel; the panels after it find them in L1. */
    bool next_rows = j->nblocks == 1 && p == 0 && g->ntaps == 1 && g->rs_i == g->tap_len;
    if (next_rows) {
        u.pf_step = 128;
    } else if (ip && ip->tile > ip->first && ip->blk + 1 < j->nblocks) {
        next_block_piece(j, ip, p, eb, &u);
    } else { /* B some rows ahead of where the K loop reads it (cheap when it is in cache) */
        u.pf = panel + PREFETCH_ROWS * w * eb;
        u.pf_steps = j->k > PREFETCH_ROWS ? j->k - PREFETCH_ROWS : 0;
        u.pf_step = w * eb;
    }
    const void *pf = u.pf;
    const int64_t pf_steps = u.pf_steps, mr = v->mr, nt = (rows + mr - 1) / mr;
    const af_ukr_fn(*ukr)[AF_GEMM_MR_MAX + 1] = v->ukr[g->type];
    /* one or two rows: the whole panel in one call (vec_impl.h ukr_row_body) */
    bool whole = rows <= 2 && g->type <= AF_GEMM_F16;
    if (o.codes) {
        u.codes_scale = g->ep->codes_scale;
        u.codes_zero = g->ep->codes_zero;
    }
    for (int64_t cc = 0; cc < valid;) {
        /* two vectors where the panel has them, one for a last part of one vector or less */
        int64_t got = valid - cc, nv = w - cc >= 2 * v->vw && got > v->vw ? 2 : 1;
        if (whole) nv = (got + v->vw - 1) / v->vw;
        if (got > nv * v->vw) got = nv * v->vw;
        int64_t col = g->ep_col0 + j0 + cc;
        u.b = panel + cc * eb;
        u.bias = re->bias && !j->acc ? re->bias + col : NULL;
        u.ldres = j->acc ? g->ldc : ld;
        u.clamp = re->clamped && !j->partial ? re->clamp : NULL;
        u.prog = re->prog.n ? &re->prog : NULL;
        u.last = got - (nv - 1) * v->vw;
        if (g->type == AF_GEMM_U8S8) {
            u.colsum = j->colsum + j0 + cc;
            u.qscale = g->qscale + j0 + cc;
            u.qzero = g->qzero;
            u.w7 = g->w7;
        }
        for (int64_t t = 0; t < nt; t++) { /* tiles of equal size, to a row */
            int64_t r0 = rows * t / nt, tr = rows * (t + 1) / nt - r0;
            u.a = (const char *)a + r0 * g->rs_i * ea;
            u.c = o.c ? o.c + r0 * o.ldc + cc : NULL;
            u.codes = o.codes ? o.codes + r0 * o.ldc + cc : NULL;
            u.res = j->acc ? u.c : re->res ? re->res + (row + r0) * ld + col : NULL;
            if (next_rows) {
                u.pf = (const char *)u.a + tr * g->rs_i * ea;
                u.pf_steps = (tr * g->tap_len * ea / 64 + 1) / 2;
            } else { /* the item's own fetches, once */
                u.pf = pf;
                u.pf_steps = t ? 0 : pf_steps;
            }
            if (whole) v->ukr_row[g->type][tr - 1][nv](&u);
            else ukr[nv - 1][tr](&u);
        }
        cc += got;
    }
}

/* Codes out through a tile: the products and the rest of the program on it, in L1, then each
 * row converted. Its own function, so that the tile is not in every run_panel's frame. */
static void __attribute__((noinline)) panel_tiled(const gemm_job *j, const void *a, int64_t m,
                                                  int64_t rows, int64_t p, const item_pf *ip) {
    const af_gemm *g = j->g;
    float tile[CODES_ROWS * AF_GEMM_NR];
    AF_ASSERT(rows <= CODES_ROWS);
    int64_t j0 = p * AF_GEMM_NR, valid = g->n - j0 < AF_GEMM_NR ? g->n - j0 : AF_GEMM_NR;
    int64_t row = g->ep_row0 + m;
    panel_products(j, a, m, rows, p, ip, (panel_out){tile, NULL, AF_GEMM_NR});
    if (has_steps(&j->rep.rest)) j->v->ep_tile(&j->rep.rest, tile, AF_GEMM_NR, row, g->ep_col0 + j0, rows, valid);
    for (int64_t r = 0; r < rows; r++)
        j->v->to_u8(tile + r * AF_GEMM_NR, g->ep->codes + (row + r) * g->ep->cols + g->ep_col0 + j0,
                    valid, g->ep->codes_scale, g->ep->codes_zero);
}

/* Rows [m, m + rows) (A rows at a) times panel p into C and through the epilogue: its bias and
 * residual in registers, the rest on the stored block. The rows go through the micro-kernel in
 * tiles of at most mr (a short K's items have several: gemm_group), the call's arguments set
 * once per panel column range and only the row pointers moved between tiles. The panel's last
 * columns are stored with masks: a tile aside, copied out and put through the whole program
 * generically, had EfficientNet-B4's two 24-channel projections take 1.2-1.4 ms each at 1
 * thread, 0.6-0.9 now. Codes out (af_vep.codes, U8S8 only): a quarter of the bytes a float
 * output writes, and the int8 conv reading them converts nothing; the micro-kernels convert
 * their registers when the program runs there whole (a per-row conversion of a stored tile
 * cost ResNet-50's 1x1 convs 10%), else panel_tiled. */
static void __attribute__((noinline)) run_panel(const gemm_job *j, const void *a, int64_t m,
                                                int64_t rows, int64_t p, const item_pf *ip) {
    const af_gemm *g = j->g;
    int64_t j0 = p * AF_GEMM_NR, valid = g->n - j0 < AF_GEMM_NR ? g->n - j0 : AF_GEMM_NR;
    uint8_t *codes = g->ep ? g->ep->codes : NULL;
    if (codes && has_steps(&j->rep.rest)) {
        panel_tiled(j, a, m, rows, p, ip);
        return;
    }
    if (codes) {
        panel_products(j, a, m, rows, p, ip,
                       (panel_out){NULL, codes + (g->ep_row0 + m) * g->ep->cols + g->ep_col0 + j0, g->ep->cols});
        return;
    }
    float *c = g->c + m * g->ldc + j0;
    panel_products(j, a, m, rows, p, ip, (panel_out){c, NULL, g->ldc});
    if (!j->partial && has_steps(&j->rep.rest))
        j->v->ep_tile(&j->rep.rest, c, g->ldc, g->ep_row0 + m, g->ep_col0 + j0, rows, valid);
}

/* Rows [m, m + mr) times panel p on AMX: the block straight into C when it covers whole tiles
 * inside C, else into a local tile whose valid part is copied; then the whole epilogue program
 * on those outputs while they are in L1. */
static void run_panel_amx(const gemm_job *j, const uint16_t *a, int64_t m, int64_t mr, int64_t p) {
    const af_gemm *g = j->g;
    int64_t w = panel_width(g->n, p), j0 = p * AF_GEMM_NR;
    int64_t valid = g->n - j0 < w ? g->n - j0 : w, computed = mr > 16 ? 32 : 16;
    float tile[32 * AF_GEMM_NR], *c = g->c + m * g->ldc + j0;
    bool direct = valid == w && mr == computed;
    af_amx_args u = {a, g->rs_i, g->tap_off, g->ntaps, g->tap_len,
                     (const uint32_t *)g->b + j0 * j->k, w, mr, direct ? c : tile,
                     direct ? g->ldc : AF_GEMM_NR};
    af_amx_block(&u);
    if (!direct)
        for (int64_t r = 0; r < mr; r++)
            memcpy(c + r * g->ldc, tile + r * AF_GEMM_NR, (size_t)valid * sizeof(float));
    if (has_steps(g->ep))
        j->v->ep_tile(g->ep, c, g->ldc, g->ep_row0 + m, g->ep_col0 + j0, mr, valid);
}

/* Panels [p0, p0 + bl) of B with row k multiplied by b_rowscale[k], into dst (the same layout
 * from panel p0 on), in the ISA's vectors (a loop here is built for the baseline ISA, 4 floats
 * at a time). Scaling costs EfficientNet-B4's 12x12x1632 projections about 12% of their time
 * (in L2-speed passes over B, not in multiplies: vectorising it saved 1%). */
static void scale_block(const gemm_job *j, int64_t p0, int64_t bl, float *dst) {
    const af_gemm *g = j->g;
    for (int64_t p = p0; p < p0 + bl; p++) {
        int64_t w = panel_width(g->n, p);
        j->v->scale_rows((const float *)g->b + p * AF_GEMM_NR * j->k, g->b_rowscale, j->k, w,
                         dst + (p - p0) * AF_GEMM_NR * j->k);
    }
}

/* Items are (part, block, M tile, panel of the block), in that order: a thread's contiguous range
 * runs each tile across a block's panels (its rows of A stay in L1) and the block's panels
 * across tiles (they stay in L2), and since every item costs the same, the threads' starting
 * shares are even whatever the counts (5 panels in blocks of 3 and 2 included). Parts are
 * ranges of M tiles, one per thread when the threads are to keep the rows of C they make
 * (see af_gemm_run), else one. An item_at says where one lies: part, block (first panel p0,
 * bl panels), tile of the part (t0 + ti, nt tiles in the part) and panel of the block (p0 + pi). */
typedef struct item_at {
    int64_t part, t0, nt, blk, p0, bl, ti, pi;
} item_at;

static void item_part(const gemm_job *j, item_at *c) {
    c->t0 = c->part * j->part_tiles;
    c->nt = j->ntiles - c->t0 < j->part_tiles ? j->ntiles - c->t0 : j->part_tiles;
}

static void item_block(const gemm_job *j, item_at *c) {
    c->p0 = c->blk * j->block;
    c->bl = j->npanels - c->p0 < j->block ? j->npanels - c->p0 : j->block;
}

static item_at item_find(const gemm_job *j, int64_t it) {
    item_at c;
    int64_t per_part = j->part_tiles * j->npanels;
    c.part = it / per_part;
    item_part(j, &c);
    int64_t pit = it % per_part, per_block = c.nt * j->block, rem = pit % per_block;
    c.blk = pit / per_block;
    item_block(j, &c);
    c.ti = rem / c.bl;
    c.pi = rem % c.bl;
    return c;
}

/* The item after c: the panel fastest, then the tile, the block, the part (the order of
 * gemm_range's items). Decoding every item from its index took about ten 64-bit divisions,
 * some 100 cycles a call: as much as the 16 K steps of a 6 x 16 tile (a K = 16 1x1 conv). */
static void item_next(const gemm_job *j, item_at *c) {
    if (++c->pi < c->bl) return;
    c->pi = 0;
    if (++c->ti < c->nt) return;
    c->ti = 0;
    if (++c->blk == j->nblocks) {
        c->blk = 0;
        c->part++;
        item_part(j, c);
    }
    item_block(j, c);
}

static void gemm_range(void *ctx, int slot, int64_t begin, int64_t end) {
    gemm_job *j = ctx;
    const af_gemm *g = j->g;
    int64_t *cur = &j->cur[slot], *first = &j->first[slot];
    /* with b_rowscale: this thread's scaled copy of the block it runs */
    float *mine = g->b_rowscale ? g->b_scratch + (size_t)slot * af_gemm_rowscale_floats(j->k, g->n)
                                : NULL;
    if (j->amx) af_amx_begin();
    item_at c = begin < end ? item_find(j, begin) : (item_at){0};
    int64_t rows_of = -1, o = 0, i0 = 0, mr = 0; /* the tile whose rows o, i0, mr are */
    for (int64_t it = begin; it < end; it++, item_next(j, &c)) {
        int64_t tile = c.t0 + c.ti, p = c.p0 + c.pi;
        if (c.part * j->nblocks + c.blk + 1 != *cur) {
            *cur = c.part * j->nblocks + c.blk + 1, *first = tile;
            if (mine) scale_block(j, c.p0, c.bl, mine);
        }
        item_pf ip = {c.blk, tile, *first, c.t0 + c.nt, (const char *)mine};
        if (tile != rows_of) tile_rows(j, tile, &o, &i0, &mr), rows_of = tile;
        if (mr == 0) continue;
        int64_t off = o * g->rs_o + i0 * g->rs_i;
        if (j->amx) {
            run_panel_amx(j, (const uint16_t *)g->a + off, o * (g->cs_o ? g->cs_o : g->mi) + i0, mr, p);
            continue;
        }
        const void *a = g->type == AF_GEMM_BF16   ? (const void *)((const uint16_t *)g->a + off)
                        : g->type == AF_GEMM_U8S8 ? (const void *)((const uint8_t *)g->a + off)
                                                  : (const void *)((const float *)g->a + off);
        run_panel(j, a, o * (g->cs_o ? g->cs_o : g->mi) + i0, mr, p, &ip);
    }
    if (j->amx) af_amx_end();
}

/* Rows of one packed panel: K, or its K / 2 pairs in BF16, its K / 4 quads in U8S8. */
static int64_t panel_rows(const af_gemm *g) {
    AF_ASSERT(g->type != AF_GEMM_BF16 || g->tap_len % AF_GEMM_BF16_KB == 0);
    AF_ASSERT(g->type != AF_GEMM_U8S8 || (g->tap_len % AF_GEMM_U8S8_KB == 0 && g->qscale));
    AF_ASSERT((!g->k0 && !g->kp) || (g->type != AF_GEMM_BF16 && g->type != AF_GEMM_U8S8 &&
                                      !g->b_rowscale && g->k0 + g->ntaps * g->tap_len <= g->kp));
    int64_t k = g->kp ? g->kp : g->ntaps * g->tap_len;
    return g->type == AF_GEMM_BF16 ? k / 2 : g->type == AF_GEMM_U8S8 ? k / 4 : k;
}

void af_gemm_rows(const af_gemm *g) {
    if (g->mo != 1 || g->mi <= 0 || g->n <= 0) return;
    gemm_job j = {g, af_vec(), NULL, panel_rows(g), (g->n + AF_GEMM_NR - 1) / AF_GEMM_NR, 1, 1, 1, 1,
                  1, false, false, false, {0}, {0}, {0}};
    AF_ASSERT(g->mi <= j.v->mr && g->type != AF_GEMM_BF16 && g->type != AF_GEMM_U8S8 && !g->b_rowscale);
    split_ep(g->ep, &j.rep, false);
    j.block = j.npanels;
    for (int64_t p = 0; p < j.npanels; p++) run_panel(&j, g->a, 0, g->mi, p, NULL);
}

/* Panels per block for rows of esz-byte elements: an eighth of the L2 for B, as the next block
 * is fetched while this one runs (item_pf) and both share the L2 with A's rows and C. Measured
 * against a quarter, same binary: 1.2-1.7% faster on ViT-B/16, BERT-Base and ResNet-50 at 1
 * thread, 0.8% on EfficientNet-B4; a quarter had measured faster than half before the spread
 * fetching. */
static int64_t block_panels(int64_t k, int64_t npanels, int64_t esz) {
    int64_t b = (int64_t)(af_cpu_l2() / 8) / ((k > 0 ? k : 1) * AF_GEMM_NR * esz);
    if (b < 1) b = 1;
    return b < npanels ? b : npanels;
}

size_t af_gemm_rowscale_floats(int64_t k, int64_t n) {
    int64_t np = (n + AF_GEMM_NR - 1) / AF_GEMM_NR;
    return ((size_t)(block_panels(k, np, 4) * AF_GEMM_NR * k) + 15) & ~(size_t)15;
}

static void gemm_run(af_exec *x, const af_gemm *g, bool acc, bool partial);

/* Rows of B per K block, or 0 to run K whole. When A is larger than the L2 and K long
 * (ViT's and BERT's MLP down-projections: 197 or 128 rows of K = 3072), each block of B's panels
 * streams all of A from L3 again, and A's rows K floats apart fall into a few cache sets
 * besides. In K blocks whose slice of the micro-kernel's columns fills the L1 (512 rows with
 * AVX2 and 32 KiB), with A's slice packed contiguous: on Zen 3, simulated (cachegrind, L2
 * 512 KiB), 197 x 768 x 3072 made 12x fewer L2 misses than K whole. Blocks filling half the L1
 * (as first built) cost more in passes over C and A than they saved: gemm_bench on Zen 3, 300
 * alternations, OpenBLAS / ours 500 x 384 x 1536 (Whisper's MLP) 0.90-0.91 -> 0.97-0.98 (K
 * whole: 0.97-0.98), 197 x 768 x 3072 0.94-0.99 -> 1.02-1.03 (K whole: 0.87), 128 x 768 x 3072
 * 1.00 -> 1.05; blocks of 128, 384, 768 or 1024 rows measured worse. With A under the L2 the
 * blocks only cost: taken from half the L2 on, ResNet-50's 7x7 1x1 convs (A 400 KiB) made it
 * 2-3% slower. F32, one tap, one outer index, 24 rows or more, K at least 3 blocks. */
static int64_t k_block(const af_gemm *g) {
    if (g->type != AF_GEMM_F32 || g->ntaps != 1 || g->kp || g->b_rowscale || g->mo != 1 ||
        g->mi < 24 || (double)g->mi * (double)g->tap_len * 4.0 <= (double)af_cpu_l2())
        return 0;
    int64_t kc = (int64_t)af_cpu_l1d() / (2 * af_vec()->vw * (int64_t)sizeof(float));
    if (kc < 64 || g->tap_len < 3 * kc) return 0;
    int64_t nb = (g->tap_len + kc - 1) / kc;
    return ((g->tap_len + nb - 1) / nb + 7) & ~(int64_t)7;
}

/* g as K blocks of kc rows, each a product of A's slice (packed into a, mi x kc) by B's rows
 * [k0, k0 + kc) adding into C. */
static void gemm_k_blocks(af_exec *x, const af_gemm *g, int64_t kc, float *a) {
    static const int64_t no_offset[1] = {0};
    const float *src = (const float *)g->a + g->tap_off[0];
    for (int64_t k0 = 0; k0 < g->tap_len; k0 += kc) {
        af_gemm b = *g;
        b.tap_len = g->tap_len - k0 < kc ? g->tap_len - k0 : kc;
        for (int64_t r = 0; r < g->mi; r++)
            memcpy(a + r * kc, src + r * g->rs_i + k0, sizeof(float) * (size_t)b.tap_len);
        b.a = a;
        b.rs_i = kc;
        b.tap_off = no_offset;
        b.k0 = k0;
        b.kp = g->tap_len;
        gemm_run(x, &b, k0 > 0, k0 + b.tap_len < g->tap_len);
    }
}

/* ---- products with a few columns ---------------------------------------------------------------
 * N at most NARROW_N (a convolution to 1 to 4 channels: a segmentation or saliency head, a
 * side output): the micro-kernels compute 16 or 32 columns a tile, all but N of them wasted, so
 * a 3x3 conv from 128 channels to 1 ran at 14 GFLOP/s. Here each output is a dot product of its
 * row of A (tap by tap) with a column of B, the columns gathered once per call from the packed
 * panel into [tap][column][tap_len] (vec gemv: the N columns against one window piece at a
 * time), and the epilogue runs on each row's N outputs. */
enum { NARROW_N = 4 };

typedef struct narrow_job {
    const af_gemm *g;
    const float *cols; /* [ntaps][n][tap_len] */
} narrow_job;

static void narrow_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const narrow_job *j = ctx;
    const af_gemm *g = j->g;
    const af_vec_ops *v = af_vec();
    enum { CHUNK = 256 };
    float part[CHUNK];
    /* runs of rows within one outer index, whose A rows are rs_i apart: each tap and column
     * one gemv over the run (A's rows against the column: four rows a column load) */
    for (int64_t m = begin; m < end;) {
        int64_t o = m / g->mi, i = m % g->mi, len = g->mi - i;
        if (len > end - m) len = end - m;
        if (len > CHUNK) len = CHUNK;
        int64_t row = o * (g->cs_o ? g->cs_o : g->mi) + i;
        const float *a = (const float *)g->a + o * g->rs_o + i * g->rs_i;
        float *c = g->c + row * g->ldc;
        for (int64_t t = 0; t < g->ntaps; t++)
            for (int64_t q = 0; q < g->n; q++) {
                v->gemv(a + g->tap_off[t], g->rs_i, j->cols + (t * g->n + q) * g->tap_len, len,
                        g->tap_len, part);
                for (int64_t r = 0; r < len; r++) c[r * g->ldc + q] = t ? c[r * g->ldc + q] + part[r] : part[r];
            }
        if (has_steps(g->ep)) v->ep_tile(g->ep, c, g->ldc, g->ep_row0 + row, g->ep_col0, len, g->n);
        m += len;
    }
}

/* Floats of gathered columns a narrow product may have, on the caller's stack (a worker's,
 * inside a parallel item, as a merged expand's rows are): 32 KB, a 3x3 conv from up to 910
 * channels to one, or an RPN's objectness (256 channels to 3). The choice of path must not
 * depend on an allocation: the two paths round differently. */
enum { NARROW_COLS = 8192 };

/* True when it ran g (float32, N <= NARROW_N, N x K <= NARROW_COLS, all of B's rows, no row
 * scaling); false when g is not such a product. */
static bool narrow_run(af_exec *x, const af_gemm *g) {
    int64_t k = g->ntaps * g->tap_len, w = panel_width(g->n, 0);
    if (g->type != AF_GEMM_F32 || g->n > NARROW_N || g->b_rowscale || g->k0 || g->kp ||
        k * g->n > NARROW_COLS)
        return false;
    float cols[NARROW_COLS];
    const float *b = g->b;
    for (int64_t t = 0; t < g->ntaps; t++)
        for (int64_t q = 0; q < g->n; q++)
            for (int64_t kk = 0; kk < g->tap_len; kk++)
                cols[(t * g->n + q) * g->tap_len + kk] = b[(t * g->tap_len + kk) * w + q];
    narrow_job j = {g, cols};
    int64_t rows = g->mo * g->mi;
    af_exec_parallel(x, rows, af_exec_work_ns(x, 2.0 * (double)(rows * k * g->n), 4.0 * (double)(rows * k)),
                     narrow_rows, &j);
    return true;
}

void af_gemm_run(af_exec *x, const af_gemm *g) {
    if (g->mo <= 0 || g->mi <= 0 || g->n <= 0) return;
    AF_ASSERT(!g->ep || !g->ep->codes || g->type == AF_GEMM_U8S8); /* (run_panel) */
    if (narrow_run(x, g)) return;
    int64_t kc = k_block(g);
    float *a = kc ? af_malloc(sizeof(float) * (size_t)(g->mi * kc)) : NULL;
    if (a) gemm_k_blocks(x, g, kc, a);
    else gemm_run(x, g, false, false); /* also when the slice's memory is short */
    af_free(a);
}

/* Micro-kernel tiles per item. With a short K a call's fixed cost (its arguments, the item's
 * bookkeeping, the kernel's entry and epilogue) weighs against few K steps: in gemm_bench on
 * 12544 x 48 x 16 (MNASNet's 16 -> 48 expand) the driver's run_panel and gemm_range took a
 * quarter of the time (perf). Items of several tiles set up each panel column range once;
 * about 200 K steps of tiles per item, while each of several threads keeps eight items or more (a
 * merged expand conv's rows, one GEMM a row on one thread, group as far as they go). The tiles
 * of an item are split evenly, and every output is summed in the same order whatever its tile,
 * so results do not depend on the grouping (nor on the threads). */
static int64_t gemm_group(const af_exec *x, const af_gemm *g, int64_t k, int64_t mr) {
    int64_t group = 200 / (k > 0 ? k : 1), tiles = g->mo * ((g->mi + mr - 1) / mr);
    int threads = af_exec_threads(x);
    if (group > 8) group = 8; /* (CODES_ROWS counts on it) */
    while (threads > 1 && group > 1 && tiles / group < 8 * threads) group--;
    return group < 1 ? 1 : group;
}

static void gemm_run(af_exec *x, const af_gemm *g, bool acc, bool partial) {
    gemm_job j = {g, af_vec(), NULL, panel_rows(g), (g->n + AF_GEMM_NR - 1) / AF_GEMM_NR, 1, 1, 1, 0,
                  0, g->type == AF_GEMM_BF16 && af_cpu_amx(), acc, partial, {0}, {0}, {0}};
    split_ep(g->ep, &j.rep, acc || partial);
    /* blocks sized by the rows the products read (a range of them with kp) */
    j.block = block_panels(g->kp ? g->ntaps * g->tap_len : j.k, j.npanels, g->type == AF_GEMM_F16 ? 2 : 4);
    AF_ASSERT(!g->b_rowscale || (g->type == AF_GEMM_F32 && g->ntaps == 1 && g->b_scratch));
    if (g->type == AF_GEMM_U8S8) j.colsum = af_gemm_u8s8_colsum(g->b, g->ntaps * g->tap_len, g->n);
    j.nblocks = (j.npanels + j.block - 1) / j.block;
    int64_t mr = j.amx ? 32 : j.v->mr * gemm_group(x, g, j.k, j.v->mr);
    j.tiles_per_row = (g->mi + mr - 1) / mr;
    j.ntiles = g->mo * j.tiles_per_row;
    /* One part per thread when B is not much larger than A and C together: each thread then
     * reads all of B but only its rows of A, and writes whole rows of C, which a consumer that
     * splits by rows (the depthwise conv after an expand) finds in its own cache. Interleaved
     * runs at 2 threads: EfficientNet-B4 -1.3%, ResNet-50 -2.3%, ResNet-101 -4.6%. Split so,
     * ResNet's 7x7 layers (B 8x A + C) were 10-25% slower and BERT's 128-row products (4.5x) 2%;
     * 1.75 keeps EfficientNet's 12x12 layers (1.6x) in and ViT's 197-row products (1.95x) out. */
    int64_t m = g->mo * g->mi, parts = 1;
    if (x && (double)j.k * (double)g->n < 1.75 * (double)m * (double)(j.k + g->n)) parts = af_exec_threads(x);
    if (parts > j.ntiles) parts = j.ntiles;
    j.part_tiles = (j.ntiles + parts - 1) / parts;
    af_exec_parallel(x, j.ntiles * j.npanels, af_exec_work_ns(x, 2.0 * (double)m * (double)g->n * (double)j.k, 0.0),
                     gemm_range, &j);
}
