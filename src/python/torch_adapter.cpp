// torch_adapter.cpp — see torch_adapter.h. The callables come from
// python/ferry/torch/_torch_private.py (its current_raw_stream_getter names
// torch._C._cuda_getCurrentRawStream, checked on PyTorch 2.6-2.11, with the
// public torch.cuda.current_stream as its fallback).
#include "python/torch_adapter.h"

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace ferry::python {
namespace {

// Asks _torch_private.<getter>() once for a callable and keeps it for the life
// of the process (a static nb::object would be released after the interpreter
// is gone). Locking: the GIL guards `*slot`. No C++ static-init guard here: the
// import runs Python code, which may hand the GIL to another thread that gets
// here too; a guard would then block that thread while it holds the GIL. Two
// threads may both ask; the first answer is kept.
PyObject* adapter_callable(PyObject** slot, const char* getter) {
  if (*slot) return *slot;
  nb::object fn = nb::module_::import_("ferry.torch._torch_private").attr(getter)();
  if (!*slot) *slot = fn.release().ptr();
  return *slot;
}

}  // namespace

uintptr_t torch_current_stream(int device) {
  static PyObject* current = nullptr;
  return nb::cast<uintptr_t>(nb::handle(adapter_callable(&current, "current_raw_stream_getter"))(device));
}

}  // namespace ferry::python
