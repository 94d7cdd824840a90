"""autofusion's own API in Python's idiom: compile (the CLI's `compile`), report, verify and
the fusion rules as data. Options are keyword arguments named as the CLI's flags."""

import ctypes
import json
import os

import numpy as np

from . import _capi
from ._capi import lib
from .session import GraphOptimizationLevel, InferenceSession, SessionOptions, _options


def _spec(value):
    """{"x": [1, 3, 224, 224]} or {"ids": ["1", "1~32"]} as the CLI's "x:1,3,224,224;..."
    (a string is passed as it is)."""
    if value is None or isinstance(value, str):
        return value
    return ";".join(f"{k}:" + ",".join(str(d) for d in dims) for k, dims in value.items())


def _names(value):
    if value is None or isinstance(value, str):
        return value
    return ",".join(value)


def _session_options(threads=0, no_fusion=False, precision_mode=None, disable_fusion=None,
                     keep_fp32=None, input_shape=None, input_shape_range=None,
                     fusion_switch_file=None, calibration_data=None, calibration_method=None):
    """SessionOptions for the CLI's options given as keywords (lists, dicts or strings): they
    travel as "autofusion.<option>" config entries, which session._options reads."""
    so = SessionOptions()
    so.intra_op_num_threads = threads
    if no_fusion:
        so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL
    entries = {"precision_mode": precision_mode, "disable_fusion": _names(disable_fusion),
               "keep_fp32": _names(keep_fp32), "input_shape": _spec(input_shape),
               "input_shape_range": _spec(input_shape_range),
               "fusion_switch_file": fusion_switch_file, "calibration_data": calibration_data,
               "calibration_method": calibration_method}
    for key, value in entries.items():
        if value:
            so.add_session_config_entry("autofusion." + key, os.fspath(value))
    return so


class _Session:
    """A C session made from keyword options (those of _session_options, and no_lower: the
    graph the fusion report describes, for an ONNX export), freed on exit."""

    def __init__(self, model, no_lower=False, no_fusion=False, **options):
        o, self._keep = _options(_session_options(no_fusion=no_fusion, **options))
        o.no_lower = int(no_lower)
        handle = ctypes.c_void_p()
        _capi.call(lib.af_session_new, os.fsencode(model), ctypes.byref(o), ctypes.byref(handle))
        self.s = handle.value

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        lib.af_session_free(self.s)

    def report(self):
        r = lib.af_session_report(self.s, 1)
        return json.loads(r) if r else None


def compile(model, output, export_onnx=None, **options):  # noqa: A001 (the CLI's verb)
    """Optimise `model` (.onnx) and write the compiled model to `output` (".afm" is added when
    missing), as `autofusion compile` does; export_onnx also writes the fused graph as ONNX
    (under precision_mode="int8" the quantized QDQ model before fusion, which ONNX Runtime runs).
    Options: precision_mode, disable_fusion (list or "A,B"), keep_fp32, input_shape
    ({name: dims} or "name:d,d;..."), input_shape_range, fusion_switch_file, threads,
    calibration_data (a folder of samples) and calibration_method (minmax, percentile[:P],
    entropy) for precision_mode="int8". Returns the fusion report as a dict."""
    path = os.fspath(output)
    if not path.endswith(".afm"):
        path += ".afm"
    with _Session(model, **options) as s:
        report = s.report()
        _capi.call(lib.af_session_save, s.s, os.fsencode(path), b"autofusion.compile (Python)")
    if export_onnx:
        int8 = (options.get("precision_mode") or "").lower() == "int8"
        with _Session(model, no_lower=True, no_fusion=int8, **options) as s:
            _capi.call(lib.af_session_export_onnx, s.s, os.fsencode(export_onnx))
    return report


def report(model, **options):
    """The fusion report of `model` (.onnx) as a dict, without writing anything."""
    with _Session(model, **options) as s:
        return s.report()


def fusion_rules():
    """Every fusion rule (built in and from loaded plugins): a list of dicts with name,
    pattern, conditions and precision (what stays fp32 under mixed; None when insensitive),
    plus plugin and fused_op for a plugin's rules."""
    p = lib.af_fusion_rules_json()
    if not p:
        raise MemoryError("autofusion: out of memory")
    try:
        return json.loads(ctypes.string_at(p).decode())
    finally:
        lib.af_string_free(p)


def load_plugin(path):
    """Load a plugin library (custom ops and fusion rules) for the whole process."""
    _capi.call(lib.af_plugin_load, os.fsencode(path))


# ---- verify ------------------------------------------------------------------------------------

def _tolerance(precision_mode):
    """The CLI's defaults (docs/cli.md): fp32 rtol 1e-3 atol 1e-4, fp16 1e-2, bf16/mixed 5e-2
    (int8: 0.1, printed; the CLI judges int8 by cosine)."""
    mode = (precision_mode or "fp32").lower()
    if mode == "int8":
        return 1e-1, 1e-1
    if mode in ("fp32", "force_fp32", "must_keep_origin_dtype"):
        return 1e-3, 1e-4
    if mode in ("fp16", "force_fp16", "allow_fp32_to_fp16"):
        return 1e-2, 1e-2
    return 5e-2, 5e-2


def _compare(want, got, rtol, atol):
    """max abs / rel error, cosine and elements over atol + rtol * |want| (the CLI's rule)."""
    a = want.astype(np.float64).ravel()
    if got.shape != want.shape or got.dtype != want.dtype:
        return {"max_abs": float("inf"), "max_rel": float("inf"), "cosine": 0.0,
                "over": int(max(a.size, 1))}
    b = got.astype(np.float64).ravel()
    both_nan = np.isnan(a) & np.isnan(b)
    e = np.abs(a - b)
    e[~np.isfinite(b) & np.isfinite(a)] = np.inf
    e[both_nan] = 0.0
    over = int(np.count_nonzero(~(e <= atol + rtol * np.abs(a)) & ~both_nan))
    big = np.abs(a) > atol
    na, nb = float(np.dot(a, a)), float(np.dot(b, b))
    cos = float(np.dot(a, b) / np.sqrt(na * nb)) if na > 0 and nb > 0 else float(na == nb)
    return {"max_abs": float(e.max(initial=0.0)),
            "max_rel": float((e[big] / np.abs(a[big])).max(initial=0.0)),
            "cosine": cos if np.isfinite(cos) else 0.0, "over": over}


def _random_inputs(sess, seed):
    """Random inputs of the declared shapes (symbolic dims 1), as the CLI's verify makes them."""
    rng = np.random.default_rng(seed)
    feed = {}
    for a in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in (a.shape or [])]
        dtype = next(t for t, s in _capi.DTYPES.values() if s == a.type)
        if np.issubdtype(dtype, np.floating):
            feed[a.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feed[a.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feed[a.name] = rng.integers(0, 4, shape).astype(dtype)
    return feed


def verify(model, precision_mode=None, inputs=None, rtol=None, atol=None, seed=0,
           max_trials=96, min_cosine=None, **options):
    """The fused model (in precision_mode) against the unfused float32 graph on the same inputs
    (`inputs`: {name: array}, else random ones from `seed`), as `autofusion verify`: per output
    the largest absolute and relative error, the cosine and the elements over tolerance. Over
    tolerance, the culprits as the CLI finds them: the low-precision ops whose return to fp32
    fixes it, else the fusion rules whose switching off does (binary search, at most max_trials
    runs), and whether those switches bring the model back within tolerance. With min_cosine
    (int8's default verdict, 0.99, when neither rtol nor atol is given) an output passes when its
    cosine with the fp32 output is at least that.

    Returns {"ok", "rtol", "atol", "outputs": [{"name", "max_abs", "max_rel", "cosine",
    "over"}], "culprits": {"keep_fp32": [...], "disable_fusion": [...], "fixed": bool} or
    None, "trials"}."""
    d_rtol, d_atol = _tolerance(precision_mode)
    if min_cosine is None and (precision_mode or "").lower() == "int8" and rtol is None \
            and atol is None:
        min_cosine = 0.99
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    base_keep = _names(options.pop("keep_fp32", None))
    base_disable = _names(options.pop("disable_fusion", None))
    threads = options.pop("threads", 0)

    def session(no_fusion=False, keep=None, disable=None):
        # the reference (no_fusion) is fp32: no precision mode, no calibration
        opts = {k: v for k, v in options.items() if not (no_fusion and k.startswith("calibration_"))}
        so = _session_options(threads=threads, no_fusion=no_fusion,
                              precision_mode=None if no_fusion else precision_mode,
                              keep_fp32=",".join(x for x in (base_keep, keep) if x) or None,
                              disable_fusion=",".join(x for x in (base_disable, disable) if x) or None,
                              **opts)
        return InferenceSession(model, so)

    ref = session(no_fusion=True)
    feed = inputs if inputs is not None else _random_inputs(ref, seed)
    want = ref.run(None, feed)
    names = [o.name for o in ref.get_outputs()]
    ref.close()
    trials = [0]

    def trial(keep=None, disable=None):
        trials[0] += 1
        with session(keep=keep, disable=disable) as s:
            got = s.run(None, feed)
        figs = [dict(name=n, **_compare(w, g, rtol, atol)) for n, w, g in zip(names, want, got)]
        if min_cosine:
            return all(f["cosine"] >= min_cosine for f in figs), figs
        return all(f["over"] == 0 for f in figs), figs

    ok, figures = trial()
    result = {"ok": ok, "rtol": rtol, "atol": atol, "min_cosine": min_cosine, "outputs": figures,
              "culprits": None}
    if not ok:
        result["culprits"] = _culprits(model, session, trial, trials, max_trials)
    result["trials"] = trials[0]
    return result


def _culprits(model, session, trial, trials, max_trials):
    with session() as s:
        rep = s.fusion_report() or {}
    ops = [e["node"] for e in (rep.get("precision") or {}).get("ops", [])
           if e.get("precision") != "fp32"]
    rules = [name for name, r in (rep.get("graph_fusion") or {}).items()
             if r.get("effect_times", 0) > 0]

    def passes(keep, disable):
        if trials[0] >= max_trials:
            return False
        return trial(",".join(keep) or None, ",".join(disable) or None)[0]

    def search(cand, base, test):
        """A small subset of cand that, with base, passes (given base + cand does): halves,
        then each half with the other switched (binary search for several culprits)."""
        if len(cand) <= 1:
            return list(cand)
        h1, h2 = cand[:len(cand) // 2], cand[len(cand) // 2:]
        if test(base + h1):
            return search(h1, base, test)
        if test(base + h2):
            return search(h2, base, test)
        r1 = search(h1, base + h2, test)
        return r1 + search(h2, base + r1, test)

    keep, disable = [], []
    if ops and passes(ops, []):
        keep = search(ops, [], lambda k: passes(k, []))
    elif rules and passes(ops, rules):
        disable = search(rules, [], lambda d: passes(ops, d))
        keep = ops
    else:
        return {"keep_fp32": [], "disable_fusion": [], "fixed": False,
                "why": "not explained by fusion or precision: the unfused fp32 graph differs "
                       "as much (tolerances too tight for float32 rounding?)"}
    fixed = trial(",".join(keep) or None, ",".join(disable) or None)[0]
    return {"keep_fp32": keep, "disable_fusion": disable, "fixed": fixed}
