/* autofusion verify MODEL.onnx [--precision_mode=...] [--rtol=R --atol=A] [--input ...]
 *
 * The compiled model (fused, in the precision asked for) against the unfused float32 graph on
 * the same inputs: per output the largest absolute and relative error and the cosine, and a
 * verdict per element, |got - want| <= atol + rtol * |want| (polygraphy's rule; NaN or infinity
 * where the reference is finite fails). Over tolerance, it finds the culprits: first the ops
 * whose low precision is responsible (switched back to fp32 with --keep_fp32), then, if
 * precision does not explain it, the fusion rules (switched off as AUTOFUSION_DISABLE_LIST
 * does), each by binary search over the candidates (a test compiles and runs the model once),
 * and prints the smallest set found with the line that brings the model back within tolerance,
 * checked by one more run.
 *
 * Under int8 the verdict is each output's cosine with the fp32 one (>= 0.99, or --min_cosine)
 * unless --rtol or --atol is given, and the low-precision ops the search switches back are the
 * quantized Conv/MatMul/Gemm nodes (by their names in the model, as --keep_fp32 takes them).
 *
 * Exit status: 0 within tolerance, 1 over it (culprits named or not), 2 bad arguments. */
#include "cli.h"
#include "lower/lower.h"
#include "driver/session.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_NAMES = 4096, MAX_TESTS = 96 };

typedef struct names {
    const char *v[MAX_NAMES];
    int n;
} names;

/* One verification: the command's options, the inputs, the reference outputs. */
typedef struct verify {
    const cli *c;
    const inputs *in;
    af_tensor **want;
    int nout;
    double rtol, atol;
    double min_cosine; /* > 0: an output passes on its cosine alone (int8's default verdict) */
    int tests;
} verify;

/* Error figures of one output against the reference. */
typedef struct diff {
    double max_abs, max_rel, cosine;
    int64_t bad; /* elements over tolerance */
} diff;

static diff compare(const af_tensor *want, const af_tensor *got, double rtol, double atol) {
    diff d = {0, 0, 1, 0};
    int64_t n = af_tensor_numel(want);
    if (!got || got->dtype != want->dtype || af_tensor_numel(got) != n) {
        d.bad = n > 0 ? n : 1;
        d.cosine = 0;
        return d;
    }
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = af_tensor_get_double(want, i), b = af_tensor_get_double(got, i);
        double e = fabs(a - b);
        if (isnan(a) && isnan(b)) continue;
        if (!isfinite(b) && isfinite(a)) e = INFINITY;
        if (!(e <= atol + rtol * fabs(a))) d.bad++;
        d.max_abs = fmax(d.max_abs, e);
        if (fabs(a) > atol) d.max_rel = fmax(d.max_rel, e / fabs(a));
        dot += a * b;
        na += a * a;
        nb += b * b;
    }
    d.cosine = na > 0 && nb > 0 ? dot / sqrt(na * nb) : (na == nb ? 1 : 0);
    if (!isfinite(d.cosine)) d.cosine = 0;
    return d;
}

/* "a,b,c" of the names whose bit is set (a static buffer: one line at a time). */
static const char *joined(const names *u, const unsigned char *on) {
    static char buf[65536];
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < u->n; i++) {
        if (!on[i]) continue;
        int w = snprintf(buf + o, sizeof buf - o, "%s%s", o ? "," : "", u->v[i]);
        if (w < 0 || (size_t)w >= sizeof buf - o) break;
        o += (size_t)w;
    }
    return buf;
}

/* "given,extra" in buf; given or extra alone when the other is NULL. */
static const char *join_list(char *buf, size_t len, const char *given, const char *extra) {
    if (!extra || !given) return extra ? extra : given;
    snprintf(buf, len, "%s,%s", given, extra);
    return buf;
}

/* Run the fused model with these precision keeps and disabled rules (either may be NULL);
 * *ok says whether every output is within tolerance. `print` prints the per-output figures.
 * Returns 0, or 1 when the model could not be prepared or run. */
static int trial(verify *v, const char *keep, const char *disable, bool print, bool *ok) {
    af_options opt;
    cli_options(v->c, &opt);
    char dis[65536], kp[65536];
    opt.disable_fusion = join_list(dis, sizeof dis, v->c->disable_fusion, disable);
    opt.keep_fp32 = join_list(kp, sizeof kp, v->c->keep_fp32, keep);
    v->tests++;
    af_session *s = cli_session(v->c, &opt);
    af_tensor **got = s ? calloc((size_t)v->nout + 1, sizeof *got) : NULL;
    int rc = !got || run_once(s, v->in, got);
    *ok = !rc;
    for (int i = 0; i < v->nout && !rc; i++) {
        diff d = compare(v->want[i], got[i], v->rtol, v->atol);
        bool over = v->min_cosine > 0 ? !(d.cosine >= v->min_cosine) : d.bad != 0;
        *ok &= !over;
        if (print)
            printf("  %-28s max abs %.3g  max rel %.3g  cosine %.6f  %s\n",
                   af_session_output_name(s, i), d.max_abs, d.max_rel, d.cosine,
                   over ? "OVER" : "ok");
        if (print && over && v->min_cosine > 0)
            printf("  %*s cosine under %.9g\n", 28, "", v->min_cosine);
        else if (print && d.bad)
            printf("  %*s %lld of %lld elements over %.3g + %.3g * |reference|\n", 28, "",
                   (long long)d.bad, (long long)af_tensor_numel(v->want[i]), v->atol, v->rtol);
    }
    if (got) outputs_free(got, v->nout);
    free(got);
    af_session_free(s);
    return rc;
}

/* Does switching `cand` (bits) plus `base` back pass? kind 0: --keep_fp32 names, 1: rules. */
typedef struct search {
    verify *v;
    const names *u;
    int kind;
    const char *fixed_keep; /* kept in fp32 while rules are searched */
    int failed;             /* a trial could not run, or the budget ran out */
} search;

static bool passes(search *s, const unsigned char *on) {
    bool ok = false;
    if (s->v->tests >= MAX_TESTS) {
        s->failed = 1;
        return false;
    }
    const char *list = joined(s->u, on);
    char copy[65536];
    snprintf(copy, sizeof copy, "%s", list);
    if (trial(s->v, s->kind ? s->fixed_keep : copy, s->kind ? copy : NULL, false, &ok))
        s->failed = 1;
    return ok;
}

/* A small subset R of cand (bits) such that switching base + R passes, given that base + cand
 * passes and base alone does not: split in halves; one half alone may do; otherwise each half
 * is searched with the other switched (the classic binary search for several culprits). */
static void culprits(search *s, unsigned char *cand, unsigned char *base, unsigned char *out) {
    int n = s->u->n, count = 0, first = -1;
    for (int i = 0; i < n; i++)
        if (cand[i]) count++, first = first < 0 ? i : first;
    if (count == 0 || s->failed) return;
    if (count == 1) {
        out[first] = 1;
        return;
    }
    unsigned char *h1 = calloc((size_t)n, 2), *h2 = h1 ? h1 + n : NULL;
    unsigned char *t = malloc((size_t)n);
    if (!h1 || !t) {
        s->failed = 1;
        free(h1);
        free(t);
        return;
    }
    for (int i = 0, k = 0; i < n; i++)
        if (cand[i]) (k++ < count / 2 ? h1 : h2)[i] = 1;
    for (int i = 0; i < n; i++) t[i] = base[i] | h1[i];
    if (passes(s, t)) {
        culprits(s, h1, base, out);
    } else {
        for (int i = 0; i < n; i++) t[i] = base[i] | h2[i];
        if (passes(s, t)) {
            culprits(s, h2, base, out);
        } else {
            unsigned char *r1 = calloc((size_t)n, 1);
            if (!r1) {
                s->failed = 1;
            } else {
                for (int i = 0; i < n; i++) t[i] = base[i] | h2[i];
                culprits(s, h1, t, r1);
                for (int i = 0; i < n; i++) t[i] = base[i] | r1[i];
                culprits(s, h2, t, out);
                for (int i = 0; i < n; i++) out[i] |= r1[i];
                free(r1);
            }
        }
    }
    free(h1);
    free(t);
}

/* The low-precision ops and the applied rules of the fused model. */
static int candidates(const cli *c, names *ops, names *rules, char **strs) {
    af_options opt;
    cli_options(c, &opt);
    af_session *s = cli_session(c, &opt);
    if (!s) return 1;
    const af_fusion_report *r = af_session_fusion_report(s);
    size_t len = 1;
    for (int i = 0; r && i < r->nprec; i++) len += strlen(r->prec[i].node) + 1;
    char *buf = malloc(len), *p = buf;
    if (!buf) {
        af_session_free(s);
        return 1;
    }
    for (int i = 0; r && i < r->nprec && ops->n < MAX_NAMES; i++) {
        if (!strcmp(r->prec[i].precision, "fp32")) continue;
        size_t l = strlen(r->prec[i].node);
        memcpy(p, r->prec[i].node, l + 1);
        ops->v[ops->n++] = p;
        p += l + 1;
    }
    for (int rule = 0; r && rule < af_fusion_rule_count(); rule++)
        if (af_fusion_report_applied(r, rule) > 0) rules->v[rules->n++] = af_fusion_rule_name(rule);
    *strs = buf;
    af_session_free(s);
    return 0;
}

/* One line per culprit op: its op and the rules that built it, from a fresh report. */
static void describe_ops(const cli *c, const names *ops, const unsigned char *on) {
    af_options opt;
    cli_options(c, &opt);
    af_session *s = cli_session(c, &opt);
    const af_fusion_report *r = s ? af_session_fusion_report(s) : NULL;
    for (int i = 0; i < ops->n; i++) {
        if (!on[i]) continue;
        const af_precision_entry *e = NULL;
        for (int k = 0; r && k < r->nprec && !e; k++)
            if (!strcmp(r->prec[k].node, ops->v[i])) e = &r->prec[k];
        printf("  %s (%s%s%s) in %s\n", ops->v[i], e ? e->op : "?",
               e && e->rules[0] ? " by " : "", e ? e->rules : "", e ? e->precision : "?");
    }
    af_session_free(s);
}

/* Whether the model quantizes (QDQ, QOperator, dynamic): its fused graph runs int8 where the
 * unfused one computes the QuantizeLinear/DequantizeLinear nodes in float, so single elements
 * differ by whole quantization steps and the cosine is the verdict, as under int8. */
static bool model_quantized(const cli *c) {
    af_options opt;
    cli_options(c, &opt);
    af_session *s = cli_session(c, &opt);
    const af_fusion_report *r = s ? af_session_fusion_report(s) : NULL;
    bool q = r && r->quantized;
    af_session_free(s);
    return q;
}

static double tolerance(const char *given, const char *precision, bool rel) {
    if (given) return strtod(given, NULL);
    if (!precision || af_precision_parse(precision) == AF_PREC_FP32) return rel ? 1e-3 : 1e-4;
    if (af_precision_parse(precision) == AF_PREC_FP16) return 1e-2;
    if (af_precision_parse(precision) == AF_PREC_INT8) return 0.1; /* printed; cosine decides */
    return 5e-2; /* bf16, mixed: 8 significant bits on every GEMM input */
}

int cmd_verify(const cli *c) {
    for (int i = 0; i < 3; i++) {
        const char *t = i == 0 ? c->rtol : i == 1 ? c->atol : c->min_cosine;
        char *end;
        double x = t ? strtod(t, &end) : 0;
        if (t && (*end || end == t || !(x >= 0) || (i == 2 && !(x <= 1)))) {
            fprintf(stderr, "autofusion verify: --rtol and --atol want a number >= 0, "
                            "--min_cosine one in [0, 1], got '%s'\n", t);
            return 2;
        }
    }
    if (c->precision_mode && af_precision_parse(c->precision_mode) < 0) {
        fprintf(stderr, "autofusion verify: unknown precision mode '%s'\n", c->precision_mode);
        return 2;
    }
    af_options ref;
    cli_options(c, &ref);
    ref.no_fusion = 1;
    ref.precision_mode = NULL; /* the fp32 reference: no precision options */
    ref.keep_fp32 = ref.calibration_data = ref.calibration_method = NULL;
    inputs in = {0};
    af_session *rs = cli_session(c, &ref);
    int nout = rs ? af_session_output_count(rs) : 0, rc = 1;
    af_tensor **want = rs ? calloc((size_t)nout + 1, sizeof *want) : NULL;
    names *ops = calloc(1, sizeof *ops), *rules = calloc(1, sizeof *rules);
    char *strs = NULL;
    unsigned char *a = NULL, *b = NULL, *o = NULL;
    if (!want || !ops || !rules || inputs_make(c, rs, &in) || run_once(rs, &in, want)) goto done;
    verify v = {c, &in, want, nout, tolerance(c->rtol, c->precision_mode, true),
                tolerance(c->atol, c->precision_mode, false), 0, 0};
    /* int8 (ours, or the model's own quantization) is judged by the cosine of each output
     * (0.99 unless --min_cosine), per element only when --rtol or --atol is given:
     * quantization moves single elements by whole steps */
    bool ours = c->precision_mode && af_precision_parse(c->precision_mode) == AF_PREC_INT8;
    bool own = !ours && !c->rtol && !c->atol && !c->min_cosine && model_quantized(c);
    bool int8 = ours || own;
    if (c->min_cosine) v.min_cosine = strtod(c->min_cosine, NULL);
    else if (int8 && !c->rtol && !c->atol) v.min_cosine = 0.99;
    const char *mode = own ? "int8 (the model's quantization)" : c->precision_mode ? c->precision_mode : "fp32";
    if (v.min_cosine > 0)
        printf("%s: fused, %s, against unfused fp32 (cosine >= %.9g)\n", c->model, mode,
               v.min_cosine);
    else
        printf("%s: fused, %s, against unfused fp32 (rtol %.3g, atol %.3g)\n", c->model, mode,
               v.rtol, v.atol);
    bool ok = false;
    if (trial(&v, NULL, NULL, true, &ok)) goto done;
    if (ok) {
        printf("within tolerance\n");
        rc = 0;
        goto done;
    }
    printf("over tolerance: looking for the culprits\n");
    if (candidates(c, ops, rules, &strs)) goto done;
    int n = ops->n > rules->n ? ops->n : rules->n;
    a = calloc((size_t)n + 1, 1), b = calloc((size_t)n + 1, 1), o = calloc((size_t)n + 1, 1);
    if (!a || !b || !o) goto done;
    char keep_line[65536] = "", disable_line[65536] = "";
    /* Precision first: all low-precision ops back in fp32 must fix it for them to be the cause. */
    search s = {&v, ops, 0, NULL, 0};
    memset(a, 1, (size_t)ops->n);
    if (ops->n && passes(&s, a)) {
        culprits(&s, a, b, o);
        snprintf(keep_line, sizeof keep_line, "%s", joined(ops, o));
        int found = 0;
        for (int i = 0; i < ops->n; i++) found += o[i];
        printf("precision: %d of %d low-precision ops responsible:\n", found, ops->n);
        describe_ops(c, ops, o);
    } else {
        /* Not (only) precision: keep every op fp32 and search the fusion rules. */
        if (ops->n) snprintf(keep_line, sizeof keep_line, "%s", joined(ops, a));
        search r = {&v, rules, 1, keep_line[0] ? keep_line : NULL, 0};
        memset(a, 1, (size_t)rules->n);
        memset(o, 0, (size_t)n);
        if (!rules->n || !passes(&r, a)) {
            printf("not explained by fusion or precision: the unfused fp32 graph differs as much "
                   "(tolerances too tight for float32 rounding?)\n");
            goto done;
        }
        culprits(&r, a, b, o);
        snprintf(disable_line, sizeof disable_line, "%s", joined(rules, o));
        printf("fusion: rules responsible: %s\n", disable_line);
        s.failed |= r.failed;
    }
    if (s.failed) printf("(the search stopped early: %d trials)\n", v.tests);
    bool fixed = false;
    if (trial(&v, keep_line[0] ? keep_line : NULL, disable_line[0] ? disable_line : NULL, true,
              &fixed))
        goto done;
    printf("%s with:\n", fixed ? "within tolerance" : "still over tolerance");
    if (disable_line[0]) printf("  AUTOFUSION_DISABLE_LIST=%s\n", disable_line);
    if (keep_line[0]) printf("  --keep_fp32=%s\n", keep_line);
    printf("(%d trials)\n", v.tests);
done:
    if (want) outputs_free(want, nout);
    free(want);
    free(ops);
    free(rules);
    free(strs);
    free(a), free(b), free(o);
    inputs_free(&in);
    af_session_free(rs);
    return rc;
}
