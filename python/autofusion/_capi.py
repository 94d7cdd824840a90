"""The C API (include/autofusion.h) through ctypes, and nothing else: structures, signatures,
the dtype table and the mapping of af_status codes to exception classes.

Why ctypes and not a CPython extension: one library serves every Python 3 (no build against
Python's headers or ABI), ctypes releases the GIL for the whole of each C call (so Python threads
run sessions in parallel without any code of ours), and the binding stays readable Python. The
per-call cost is measured in BENCHMARKS.md ("Python").
"""

import ctypes
import os

import numpy as np

from . import errors

MAX_RANK = 8


class Tensor(ctypes.Structure):
    """af_tensor."""
    _fields_ = [("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("dims", ctypes.c_int64 * MAX_RANK), ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_size_t), ("owns_data", ctypes.c_int)]


class Error(ctypes.Structure):
    """af_error."""
    _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_char * 1024)]


class Options(ctypes.Structure):
    """af_options."""
    _fields_ = [("threads", ctypes.c_int), ("input_shape", ctypes.c_char_p),
                ("log_level", ctypes.c_int), ("no_fusion", ctypes.c_int),
                ("disable_fusion", ctypes.c_char_p), ("fusion_switch_file", ctypes.c_char_p),
                ("no_lower", ctypes.c_int), ("precision_mode", ctypes.c_char_p),
                ("keep_fp32", ctypes.c_char_p), ("input_shape_range", ctypes.c_char_p),
                ("calibration_data", ctypes.c_char_p), ("calibration_method", ctypes.c_char_p)]


class ReferenceStats(ctypes.Structure):
    """af_reference_stats."""
    _fields_ = [("nodes", ctypes.c_int), ("reference_ms", ctypes.c_double),
                ("run_ms", ctypes.c_double), ("ops", ctypes.c_char * 256)]


# af_dtype code -> (numpy dtype or None, ONNX Runtime's type string)
DTYPES = {
    1: (np.float32, "tensor(float)"), 2: (np.uint8, "tensor(uint8)"),
    3: (np.int8, "tensor(int8)"), 4: (np.uint16, "tensor(uint16)"),
    5: (np.int16, "tensor(int16)"), 6: (np.int32, "tensor(int32)"),
    7: (np.int64, "tensor(int64)"), 8: (None, "tensor(string)"),
    9: (np.bool_, "tensor(bool)"), 10: (np.float16, "tensor(float16)"),
    11: (np.float64, "tensor(double)"), 12: (np.uint32, "tensor(uint32)"),
    13: (np.uint64, "tensor(uint64)"), 14: (np.complex64, "tensor(complex64)"),
    15: (np.complex128, "tensor(complex128)"), 16: (None, "tensor(bfloat16)"),
}
CODE_OF = {np.dtype(t): code for code, (t, _) in DTYPES.items() if t is not None}


def type_string(code):
    return DTYPES.get(code, (None, "tensor(undefined)"))[1]


def _library_path():
    """$AUTOFUSION_LIBRARY, else the library beside this file (the built or installed
    package), else the build tree's when this is the source tree (python/autofusion)."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("AUTOFUSION_LIBRARY"), os.path.join(here, "libautofusion.so"),
                  os.path.join(here, "..", "..", "build", "python", "autofusion",
                               "libautofusion.so")]
    for path in candidates:
        if path and os.path.exists(path):
            return path
    raise ImportError(f"autofusion: libautofusion.so is not beside {here}: build the project "
                      f"(cmake --build build) and import the package from build/python, or "
                      f"install it (cmake --install build --component python)")


def _load():
    path = _library_path()
    # RTLD_GLOBAL: plugins (--plugin .so files) resolve af_* from this library
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    P, I, S, E = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(Error)
    T = ctypes.POINTER(Tensor)
    sigs = {
        "af_version": (S, []),
        "af_options_init": (None, [ctypes.POINTER(Options)]),
        "af_session_new": (I, [S, ctypes.POINTER(Options), ctypes.POINTER(P), E]),
        "af_session_new_from_bytes": (I, [S, ctypes.c_size_t, S, ctypes.POINTER(Options),
                                          ctypes.POINTER(P), E]),
        "af_session_free": (None, [P]),
        "af_session_input_count": (I, [P]),
        "af_session_default_input_count": (I, [P]),
        "af_session_output_count": (I, [P]),
        "af_session_input_name": (S, [P, I]),
        "af_session_output_name": (S, [P, I]),
        "af_session_input_type": (I, [P, I, T]),
        "af_session_output_type": (I, [P, I, T]),
        "af_session_dim_name": (S, [P, I, I, I, ctypes.c_char_p, ctypes.c_size_t]),
        "af_session_metadata": (S, [P, S]),
        "af_session_custom_metadata": (I, [P, I, ctypes.POINTER(S), ctypes.POINTER(S)]),
        "af_session_report": (S, [P, I]),
        # names, inputs and outputs are addresses of arrays the caller packs (session.py)
        "af_session_run": (I, [P, P, P, ctypes.c_size_t, P, E]),
        "af_session_threads": (I, [P]),
        "af_session_isa": (S, [P]),
        "af_session_precision": (S, [P]),
        "af_session_save": (I, [P, S, S, E]),
        "af_session_export_onnx": (I, [P, S, E]),
        "af_session_profile_start": (I, [P, E]),
        "af_session_profile_end": (I, [P, S, E]),
        "af_session_reference_stats": (I, [P, ctypes.POINTER(ReferenceStats), E]),
        "af_tensor_free": (None, [P]),
        "af_fusion_rules_json": (P, []),
        "af_string_free": (None, [P]),
        "af_plugin_load": (I, [S, E]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


lib = _load()


def check(status, err):
    """Raise the exception class of `status` with the library's one-line message."""
    if status:
        raise errors.from_status(status, err.message.decode("utf-8", "replace"))


def call(fn, *args):
    """fn(*args, &err), raising on failure."""
    err = Error()
    check(fn(*args, ctypes.byref(err)), err)


def text(b):
    return b.decode("utf-8", "replace") if b is not None else None
