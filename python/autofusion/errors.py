"""The exception classes ONNX Runtime's Python users catch
(onnxruntime.capi.onnxruntime_pybind11_state), raised with autofusion's one-line messages.
Every one derives from AutofusionError, so that `except autofusion.AutofusionError` catches
them all."""


class AutofusionError(Exception):
    """Base of every error the library reports."""


class Fail(AutofusionError):
    pass


class InvalidArgument(AutofusionError):
    pass


class NoSuchFile(AutofusionError):
    pass


class NoModel(AutofusionError):
    pass


class EngineError(AutofusionError):
    pass


class RuntimeException(AutofusionError):
    pass


class InvalidProtobuf(AutofusionError):
    pass


class ModelLoaded(AutofusionError):
    pass


class NotImplemented(AutofusionError):  # noqa: A001 (ONNX Runtime's name)
    pass


class InvalidGraph(AutofusionError):
    pass


class EPFail(AutofusionError):
    pass


# af_status (include/autofusion.h) -> class
_BY_STATUS = {
    1: NoSuchFile,        # AF_ERR_IO: a file could not be opened, mapped or read
    2: InvalidProtobuf,   # AF_ERR_PARSE
    3: InvalidGraph,      # AF_ERR_INVALID_MODEL
    4: NotImplemented,    # AF_ERR_UNSUPPORTED
    5: InvalidArgument,   # AF_ERR_INVALID_ARG
    6: RuntimeException,  # AF_ERR_NOMEM
    7: RuntimeException,  # AF_ERR_RUNTIME
    8: Fail,              # AF_ERR_INTERNAL
}


def from_status(status, message):
    return _BY_STATUS.get(status, Fail)(message)
