// error_bindings.cpp — the exception translator: ferry::Error becomes the
// ferry.errors class of its status (FerryError subclasses that also derive
// from MemoryError, ValueError, ...); ferry::OsError becomes OSLayerError, an
// OSError whose .errno callers test.
//
// A message may hold bytes that are not UTF-8 (a file name as the OS spelled
// it): they appear as \xNN escapes, never as a UnicodeDecodeError in place of
// the error. The last resort for a conversion that no checked argument
// (args.h) caught: nanobind's std::bad_cast (a cast_error) becomes
// InvalidArgumentError, not "RuntimeError: std::bad_cast".
#include <nanobind/nanobind.h>

#include <string>
#include <typeinfo>

#include "core/error.h"
#include "python/bindings.h"

namespace nb = nanobind;

namespace ferry::python {
namespace {

// The ferry.errors class of each C status (python/ferry/errors.py).
const char* error_class(ferry_status_t s) {
  switch (s) {
    case FERRY_ERROR_INVALID_ARGUMENT: return "InvalidArgumentError";
    case FERRY_ERROR_OUT_OF_MEMORY: return "OutOfMemoryError";
    case FERRY_ERROR_OS: return "OSLayerError";
    case FERRY_ERROR_CUDA: return "CudaError";
    case FERRY_ERROR_NO_DEVICE: return "NoDeviceError";
    case FERRY_ERROR_NOT_SUPPORTED: return "NotSupportedError";
    case FERRY_ERROR_INTERNAL: return "InternalError";
    case FERRY_ERROR_TIMEOUT: return "HandoffTimeoutError";  // the node handoff's (node/handoff.h)
    case FERRY_ERROR_PEER_GONE: return "HandoffPeerGoneError";
    case FERRY_ERROR_BROKEN: return "HandoffError";
    default: return "FerryError";
  }
}

// Sets ferry.errors.<cls_name>(text), or (err, text) where err >= 0.
void raise(const char* cls_name, const std::string& text, int err = -1) {
  nb::object cls = nb::module_::import_("ferry.errors").attr(cls_name);
  PyObject* msg = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace");
  if (!msg) return;  // the decoding error stays set
  if (err < 0) {
    PyErr_SetObject(cls.ptr(), msg);
    Py_DECREF(msg);
    return;
  }
  if (PyObject* args = Py_BuildValue("(iN)", err, msg)) {  // N: args owns msg
    PyErr_SetObject(cls.ptr(), args);
    Py_DECREF(args);
  }
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const ferry::OsError& e) {
    raise("OSLayerError", e.what(), e.error_number());
  } catch (const ferry::Error& e) {
    raise(error_class(e.status()), e.what());
  } catch (const std::bad_cast&) {
    raise("InvalidArgumentError", "an argument has the wrong type (see the function's documentation)");
  }
}

}  // namespace

void bind_errors(nb::module_&) { nb::register_exception_translator(&translate); }

}  // namespace ferry::python
