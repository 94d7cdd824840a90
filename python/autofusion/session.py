"""ONNX Runtime's inference API (onnxruntime.InferenceSession and its companions) over
autofusion's C API, so that `import autofusion as ort` is the only change a script needs.

What maps to what is in docs/python.md. In short: the graph optimization level switches fusion
(ORT_DISABLE_ALL runs the unfused graph, every other level the whole pipeline), threads are
intra_op_num_threads, profiling writes our Chrome trace, optimized_model_filepath writes a .afm
(or ONNX when the name ends in .onnx), and session config entries named "autofusion.<option>"
set our own options (precision_mode, disable_fusion, keep_fp32, input_shape, input_shape_range,
fusion_switch_file, calibration_data, calibration_method).

Invariants: a numpy input that is C-contiguous, aligned, native-endian and of the declared dtype
is handed to the library without a copy (others are converted once); outputs are numpy arrays
whose memory is the library's tensor, freed with the array; the GIL is released for the whole of
a run (ctypes does so for every C call).
"""

import ctypes
import datetime
import enum
import os
import struct
import threading
import time

import numpy as np

from . import _capi
from ._capi import lib, text
from .errors import Fail, InvalidArgument

_PROVIDERS = ["CPUExecutionProvider"]
_OWN_CONFIG = ("precision_mode", "disable_fusion", "keep_fp32", "input_shape",
               "input_shape_range", "fusion_switch_file", "calibration_data",
               "calibration_method")


def get_available_providers():
    return list(_PROVIDERS)


def get_all_providers():
    return list(_PROVIDERS)


def get_device():
    return "CPU"


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class SessionOptions:
    """onnxruntime.SessionOptions. Attributes ONNX Runtime has and autofusion does not use
    (inter_op_num_threads, execution_mode, the memory arena switches...) are accepted and kept."""

    def __init__(self):
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.optimized_model_filepath = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = 0
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self._config = {}

    def add_session_config_entry(self, key, value):
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key):
        if key not in self._config:
            raise Fail(f"SessionOptions has no config entry '{key}'")
        return self._config[key]

    def add_free_dimension_override_by_name(self, name, value):
        """Fixes a symbolic dim for the session, as --input_shape would (by dim name)."""
        self._config.setdefault("_dim_overrides", {})[name] = int(value)

    def register_custom_ops_library(self, path):
        """A plugin library (include/autofusion_plugin.h), loaded for the whole process."""
        _capi.call(lib.af_plugin_load, os.fsencode(path))


class RunOptions:
    """onnxruntime.RunOptions: accepted; a run cannot be interrupted (terminate is kept)."""

    def __init__(self):
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.run_tag = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config = {}

    def add_run_config_entry(self, key, value):
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key):
        return self._config[key]


class NodeArg:
    """An input or output: name, shape (ints, strings for symbolic dims, None when unknown),
    type ('tensor(float)', ...)."""

    def __init__(self, name, shape, type):  # noqa: A002 (ONNX Runtime's name)
        self.name, self.shape, self.type = name, shape, type

    def __repr__(self):
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class ModelMetadata:
    def __init__(self, s):
        meta = lambda key: text(lib.af_session_metadata(s, key.encode())) or ""  # noqa: E731
        self.producer_name = meta("producer_name")
        self.graph_name = meta("graph_name")
        self.domain = meta("domain")
        self.description = meta("description")
        self.graph_description = ""
        self.version = int(meta("version") or 0)
        self.custom_metadata_map = {}
        k, v = ctypes.c_char_p(), ctypes.c_char_p()
        for i in range(lib.af_session_custom_metadata(s, 0, None, None)):
            lib.af_session_custom_metadata(s, i, ctypes.byref(k), ctypes.byref(v))
            self.custom_metadata_map[text(k.value)] = text(v.value)


_TENSOR = struct.Struct("=ii%dqQQi4x" % _capi.MAX_RANK)  # af_tensor
_PTR = struct.Struct("=Q")
assert _TENSOR.size == ctypes.sizeof(_capi.Tensor)


class _Owned:
    """The numpy-facing owner of a tensor the library returned: the array's base. Freeing the
    array frees the tensor."""

    __slots__ = ("ptr", "__array_interface__")

    def __init__(self, ptr, shape, dtype, data):
        self.ptr = ptr
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "data": (data, False),
                                    "version": 3}

    def __del__(self):
        lib.af_tensor_free(self.ptr)


def _to_numpy(ptr):
    """The output tensor at address ptr (owned by us now) as a numpy array that owns it."""
    f = _TENSOR.unpack(ctypes.string_at(ptr, _TENSOR.size))
    code, rank, data = f[0], f[1], f[2 + _capi.MAX_RANK]
    shape = tuple(f[2:2 + rank])
    np_type = _capi.DTYPES.get(code, (None,))[0]
    if np_type is None:
        lib.af_tensor_free(ptr)
        raise InvalidArgument(f"outputs of type {_capi.type_string(code)} cannot be returned "
                              f"as numpy arrays")
    dtype = np.dtype(np_type)
    if not data:  # an empty tensor
        lib.af_tensor_free(ptr)
        return np.empty(shape, dtype)
    return np.asarray(_Owned(ptr, shape, dtype, data))


def _options(sess_options):
    """af_options for these SessionOptions, and the byte strings they point to (keep them
    alive while the options are used)."""
    o = _capi.Options()
    lib.af_options_init(ctypes.byref(o))
    so = sess_options or SessionOptions()
    o.threads = max(0, int(so.intra_op_num_threads or 0))
    o.no_fusion = int(so.graph_optimization_level == GraphOptimizationLevel.ORT_DISABLE_ALL)
    # ONNX Runtime: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal; ours: 0 error .. 4 debug
    o.log_level = {0: 4, 1: 2, 2: 1}.get(int(so.log_severity_level), 0)
    keep = []
    for key in _OWN_CONFIG:
        value = so._config.get("autofusion." + key)
        if value is not None:
            b = value.encode()
            keep.append(b)
            setattr(o, key, b)
    return o, keep


class IOBinding:
    """onnxruntime.IOBinding: inputs bound once and reused by every run_with_iobinding; outputs
    are the library's tensors, handed out without a copy (get_outputs) or copied into the buffer
    bound with bind_output(buffer_ptr=...)."""

    def __init__(self, session):
        self._session = session
        self._inputs = {}
        self._outputs = []  # (name, (ptr, dtype, shape) or None)
        self._results = []

    def bind_cpu_input(self, name, arr):
        self._inputs[name] = arr

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        _cpu(device_type)
        dtype = np.dtype(element_type)
        count = int(np.prod(shape, dtype=np.int64))
        buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(buffer_ptr)
        self._inputs[name] = np.frombuffer(buf, dtype, count).reshape(shape)

    def bind_ortvalue_input(self, name, ortvalue):
        self._inputs[name] = ortvalue.numpy()

    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None,
                    buffer_ptr=None):
        _cpu(device_type)
        target = None
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise InvalidArgument(f"bind_output('{name}'): a buffer needs its element_type "
                                      f"and shape")
            target = (buffer_ptr, np.dtype(element_type), tuple(int(d) for d in shape))
        self._outputs.append((name, target))

    def bind_ortvalue_output(self, name, ortvalue):
        self.bind_output(name, "cpu", 0, ortvalue.element_type(), ortvalue.shape(),
                         ortvalue.data_ptr())

    def clear_binding_inputs(self):
        self._inputs = {}

    def clear_binding_outputs(self):
        self._outputs = []
        self._results = []

    def synchronize_inputs(self):
        pass

    def synchronize_outputs(self):
        pass

    def get_outputs(self):
        return [OrtValue(a) for a in self._results]

    def copy_outputs_to_cpu(self):
        return [a.copy() for a in self._results]

    def _run(self):
        names = [n for n, _ in self._outputs] or None
        results = self._session.run(names, self._inputs)
        for (name, target), arr in zip(self._outputs, results):
            if target is None:
                continue
            ptr, dtype, shape = target
            if arr.dtype != dtype or arr.shape != shape:
                raise InvalidArgument(f"output '{name}' is {arr.dtype}{list(arr.shape)}, the "
                                      f"bound buffer {dtype}{list(shape)}")
            ctypes.memmove(ptr, arr.ctypes.data, arr.nbytes)
        self._results = results


def _cpu(device_type):
    if str(device_type).lower() != "cpu":
        raise InvalidArgument(f"device '{device_type}': autofusion runs on the CPU only")


class OrtValue:
    """onnxruntime.OrtValue for CPU tensors: a numpy array, shared, not copied."""

    def __init__(self, arr):
        self._arr = arr

    @staticmethod
    def ortvalue_from_numpy(arr, device_type="cpu", device_id=0):
        _cpu(device_type)
        return OrtValue(np.ascontiguousarray(arr))

    @staticmethod
    def ortvalue_from_shape_and_type(shape, element_type, device_type="cpu", device_id=0):
        _cpu(device_type)
        return OrtValue(np.empty(shape, element_type))

    def numpy(self):
        return self._arr

    def shape(self):
        return list(self._arr.shape)

    def element_type(self):
        return self._arr.dtype.type

    def data_type(self):
        return _capi.type_string(_capi.CODE_OF.get(self._arr.dtype, 0))

    def data_ptr(self):
        return self._arr.ctypes.data

    def device_name(self):
        return "cpu"

    def is_tensor(self):
        return True

    def has_value(self):
        return True


class InferenceSession:
    """onnxruntime.InferenceSession: a model (.onnx or .afm, a path or bytes) prepared for
    runs. close() (or a with block) frees it; a closed session raises on use."""

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None,
                 **kwargs):
        self._s = None
        self._check_providers(providers)
        self._sess_options = sess_options or SessionOptions()
        self._model_path = None
        opt, keep = _options(self._sess_options)
        handle = ctypes.c_void_p()
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            data = bytes(path_or_bytes)
            _capi.call(lib.af_session_new_from_bytes, data, len(data), b"<bytes>",
                       ctypes.byref(opt), ctypes.byref(handle))
        elif isinstance(path_or_bytes, (str, os.PathLike)):
            self._model_path = os.fspath(path_or_bytes)
            _capi.call(lib.af_session_new, os.fsencode(self._model_path), ctypes.byref(opt),
                       ctypes.byref(handle))
        else:
            raise TypeError(f"InferenceSession wants a path or bytes, got "
                            f"{type(path_or_bytes).__name__}")
        self._s = handle.value
        self._lock = threading.Lock()
        self._active = 0
        self._closed = False
        self._describe()
        over = self._sess_options._config.get("_dim_overrides")
        if over:
            self._apply_overrides(over)
        self._profiling = False
        if self._sess_options.enable_profiling:
            _capi.call(lib.af_session_profile_start, self._s)
            self._profiling = True
        out = self._sess_options.optimized_model_filepath
        if out:
            self._write_optimized(os.fspath(out), opt)

    # ---- construction helpers ----------------------------------------------------------------

    @staticmethod
    def _check_providers(providers):
        for p in providers or []:
            name = p[0] if isinstance(p, (tuple, list)) else p
            if name not in _PROVIDERS:
                raise ValueError(f"provider '{name}' is not available: autofusion runs on the "
                                 f"CPU only (providers: {_PROVIDERS})")

    def _describe(self):
        s = self._s
        nin = lib.af_session_input_count(s)
        ndef = lib.af_session_default_input_count(s)
        ins = [self._node_arg(0, i) for i in range(nin + ndef)]
        self._inputs = [a for a, _ in ins[:nin]]
        self._overridable = [a for a, _ in ins[nin:]]
        self._input_dtype = {a.name: code for a, code in ins}
        self._outputs = [self._node_arg(1, i)[0] for i in range(lib.af_session_output_count(s))]
        self._output_index = {a.name: i for i, a in enumerate(self._outputs)}

    def _apply_overrides(self, over):
        """add_free_dimension_override_by_name: the named dims fixed, as --input_shape does
        (which wants whole shapes, known once the session has read the model)."""
        if self._model_path is None:
            raise InvalidArgument("free dimension overrides need a model path")
        specs = []
        for a in self._inputs:
            if any(isinstance(d, str) and d in over for d in a.shape):
                dims = [over[d] if isinstance(d, str) and d in over else d for d in a.shape]
                if all(isinstance(d, int) for d in dims):
                    specs.append(a.name + ":" + ",".join(str(d) for d in dims))
        if not specs:
            return
        self._sess_options.add_session_config_entry("autofusion.input_shape", ";".join(specs))
        self._reload()

    def _reload(self):
        opt, keep = _options(self._sess_options)
        handle = ctypes.c_void_p()
        _capi.call(lib.af_session_new, os.fsencode(self._model_path), ctypes.byref(opt),
                   ctypes.byref(handle))
        lib.af_session_free(self._s)
        self._s = handle.value
        self._describe()

    def _node_arg(self, output, i):
        t = _capi.Tensor()
        fn = lib.af_session_output_type if output else lib.af_session_input_type
        fn(self._s, i, ctypes.byref(t))
        name = text((lib.af_session_output_name if output else lib.af_session_input_name)(self._s, i))
        shape = None
        if t.rank >= 0:
            shape = []
            buf = ctypes.create_string_buffer(256)
            for d in range(t.rank):
                if t.dims[d] >= 0:
                    shape.append(int(t.dims[d]))
                else:
                    shape.append(text(lib.af_session_dim_name(self._s, output, i, d, buf, 256)))
        return NodeArg(name, shape, _capi.type_string(t.dtype)), t.dtype

    def _write_optimized(self, path, opt):
        if path.endswith(".onnx"):
            # the graph the fusion report describes (not lowered): what Netron should show
            opt.no_lower = 1
            handle = ctypes.c_void_p()
            src = os.fsencode(self._model_path) if self._model_path else None
            if src is None:
                raise InvalidArgument("optimized_model_filepath with .onnx needs a model path")
            _capi.call(lib.af_session_new, src, ctypes.byref(opt), ctypes.byref(handle))
            try:
                _capi.call(lib.af_session_export_onnx, handle.value, os.fsencode(path))
            finally:
                lib.af_session_free(handle.value)
        else:
            _capi.call(lib.af_session_save, self._s, os.fsencode(path), None)

    # ---- ONNX Runtime's surface --------------------------------------------------------------

    def get_inputs(self):
        self._handle()
        return list(self._inputs)

    def get_outputs(self):
        self._handle()
        return list(self._outputs)

    def get_overridable_initializers(self):
        self._handle()
        return list(self._overridable)

    def get_modelmeta(self):
        return ModelMetadata(self._handle())

    def get_providers(self):
        return list(_PROVIDERS)

    def get_provider_options(self):
        return {p: {} for p in _PROVIDERS}

    def get_session_options(self):
        return self._sess_options

    def set_providers(self, providers=None, provider_options=None):
        self._check_providers(providers)

    def disable_fallback(self):
        pass

    def enable_fallback(self):
        pass

    def get_profiling_start_time_ns(self):
        return 0

    def end_profiling(self):
        """Writes the Chrome trace of the runs since the session was made (enable_profiling)
        and returns its path; "" when profiling was off."""
        s = self._handle()
        if not self._profiling:
            return ""
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        path = f"{self._sess_options.profile_file_prefix}_{stamp}.json"
        _capi.call(lib.af_session_profile_end, s, os.fsencode(path))
        self._profiling = False
        return path

    def run(self, output_names, input_feed, run_options=None):
        """Outputs named by output_names (None or [] for all) as numpy arrays, in that order."""
        if not isinstance(input_feed, dict):
            raise InvalidArgument("input_feed must be a dict of input name -> numpy array")
        want = self._wanted(output_names)
        n, nout = len(input_feed), len(self._outputs)
        # the af_tensor structs, the pointers to them and the name pointers, packed into one
        # buffer: a few struct.pack_into calls cost less than ctypes objects per field
        size = _TENSOR.size
        buf = ctypes.create_string_buffer(n * (size + 16) + 8 * nout + 8)
        base = ctypes.addressof(buf)
        ptrs, names_at, outs_at = n * size, n * (size + 8), n * (size + 16)
        keep = []
        for k, (name, value) in enumerate(input_feed.items()):
            arr = self._input_array(name, value)
            if arr.ndim > _capi.MAX_RANK:
                raise InvalidArgument(f"input '{name}' has rank {arr.ndim}, more than "
                                      f"{_capi.MAX_RANK}")
            bname = name.encode()
            keep.append((arr, bname))
            dims = arr.shape + (0,) * (_capi.MAX_RANK - arr.ndim)
            _TENSOR.pack_into(buf, k * size, _capi.CODE_OF[arr.dtype], arr.ndim, *dims,
                              arr.ctypes.data, arr.nbytes, 0)
            _PTR.pack_into(buf, ptrs + 8 * k, base + k * size)
            _PTR.pack_into(buf, names_at + 8 * k, ctypes.cast(bname, ctypes.c_void_p).value)
        err = _capi.Error()
        s = self._enter()
        try:
            status = lib.af_session_run(s, base + names_at, base + ptrs, n, base + outs_at,
                                        ctypes.byref(err))
        finally:
            self._leave()
        _capi.check(status, err)
        got = [_PTR.unpack_from(buf, outs_at + 8 * i)[0] for i in range(nout)]
        arrays = [None] * nout
        try:
            for i in want:
                if arrays[i] is None:
                    arrays[i] = _to_numpy(got[i])
                    got[i] = None
            return [arrays[i] for i in want]
        finally:
            for ptr in got:
                if ptr:
                    lib.af_tensor_free(ptr)

    def run_with_iobinding(self, iobinding, run_options=None):
        iobinding._run()

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        feed = {k: v.numpy() for k, v in input_dict_ort_values.items()}
        return [OrtValue(a) for a in self.run(output_names, feed, run_options)]

    def io_binding(self):
        self._handle()
        return IOBinding(self)

    # ---- ours --------------------------------------------------------------------------------

    def fusion_report(self):
        """The fusion report (a dict) of the optimisation that prepared the session; None for a
        .afm or the unfused graph."""
        import json
        r = lib.af_session_report(self._handle(), 1)
        return json.loads(r) if r else None

    def close(self):
        """Frees the session once no run is using it; later calls raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while self._active:  # runs that started before close: let them finish
            time.sleep(0.001)
        s, self._s = self._s, None
        lib.af_session_free(s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_s", None) and hasattr(self, "_lock"):
            self.close()

    # ---- internals ---------------------------------------------------------------------------

    def _handle(self):
        if not getattr(self, "_s", None):
            raise InvalidArgument("the session is closed")
        return self._s

    def _enter(self):
        with self._lock:
            if self._closed:
                raise InvalidArgument("the session is closed")
            self._active += 1
            return self._s

    def _leave(self):
        with self._lock:
            self._active -= 1

    def _wanted(self, output_names):
        if not output_names:
            return list(range(len(self._outputs)))
        idx = []
        for name in output_names:
            if name not in self._output_index:
                raise InvalidArgument(f"the model has no output '{name}' (outputs: "
                                      f"{[a.name for a in self._outputs]})")
            idx.append(self._output_index[name])
        return idx

    def _input_array(self, name, value):
        """value as an array the library can read in place: as it is when it already is one,
        else converted once (a copy)."""
        if isinstance(value, OrtValue):
            value = value.numpy()
        code = self._input_dtype.get(name)
        if code is None:
            raise InvalidArgument(f"the model has no input '{name}' (inputs: "
                                  f"{[a.name for a in self._inputs]})")
        if not isinstance(value, np.ndarray):
            value = np.asarray(value, dtype=_capi.DTYPES[code][0])
        native = value.dtype if value.dtype.isnative else value.dtype.newbyteorder("=")
        if native not in _capi.CODE_OF:
            raise InvalidArgument(f"input '{name}': numpy dtype {value.dtype} is not a tensor "
                                  f"type")
        if _capi.CODE_OF[native] != code and code:
            raise InvalidArgument(f"Unexpected input data type for '{name}'. Actual: "
                                  f"({_capi.type_string(_capi.CODE_OF[native])}) , "
                                  f"expected: ({_capi.type_string(code)})")
        if not (value.flags.c_contiguous and value.flags.aligned) or native is not value.dtype:
            value = np.ascontiguousarray(value, dtype=native)
        return value
