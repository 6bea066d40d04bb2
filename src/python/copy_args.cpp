// copy_args.cpp — Python objects -> addresses, sizes, devices, streams.
#include "python/copy_args.h"

#include <nanobind/ndarray.h>

#include <string>

#include "core/error.h"
#include "python/args.h"
#include "python/torch_adapter.h"

namespace nb = nanobind;

namespace ferry::python {

namespace {

std::string python_type_name(nb::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

// torch.Tensor when torch is imported (never imports it).
bool is_torch_tensor(nb::handle obj) {
  static PyObject* tensor_type = nullptr;
  if (!tensor_type) {
    PyObject* modules = PyImport_GetModuleDict();
    PyObject* torch = PyDict_GetItemString(modules, "torch");  // borrowed
    if (!torch) return false;
    PyObject* t = PyObject_GetAttrString(torch, "Tensor");
    if (!t) {
      PyErr_Clear();
      return false;
    }
    tensor_type = t;  // kept for the life of the process
  }
  return PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(tensor_type));
}

CopyArg from_tensor(nb::handle t, const char* role) {
  if (!nb::cast<bool>(t.attr("is_contiguous")()))
    throw InvalidArgument(std::string(role) + ": ferry copies need contiguous tensors (call .contiguous())");
  CopyArg a;
  a.torch = true;
  a.sized = true;
  a.address = nb::cast<uintptr_t>(t.attr("data_ptr")());
  a.bytes = nb::cast<size_t>(t.attr("nbytes"));
  a.cuda_device = nb::cast<int>(t.attr("get_device")());  // -1 on the CPU
  return a;
}

CopyArg from_cuda_array_interface(nb::handle cai, const char* role) {
  nb::dict d = nb::cast<nb::dict>(cai);
  if (d.contains("strides") && !d["strides"].is_none())
    throw InvalidArgument(std::string(role) + ": ferry copies need C-contiguous arrays");
  std::string typestr = nb::cast<std::string>(d["typestr"]);
  size_t itemsize = typestr.size() > 2 ? std::stoul(typestr.substr(2)) : 0;
  if (itemsize == 0) throw InvalidArgument(std::string(role) + ": bad typestr '" + typestr + "'");
  size_t n = itemsize;
  for (nb::handle s : nb::cast<nb::tuple>(d["shape"])) n *= nb::cast<size_t>(s);
  CopyArg a;
  a.sized = true;
  a.bytes = n;
  a.address = nb::cast<uintptr_t>(nb::cast<nb::tuple>(d["data"])[0]);
  return a;
}

CopyArg from_buffer(nb::handle obj, bool writable, const char* role) {
  Py_buffer view;
  const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
    PyErr_Clear();
    if (writable && PyObject_CheckBuffer(obj.ptr()))
      throw InvalidArgument(std::string(role) + ": " + python_type_name(obj) + " is not a writable contiguous buffer");
    throw InvalidArgument(std::string(role) + ": cannot copy " + python_type_name(obj) +
                          ": expected an int address, a buffer, a __cuda_array_interface__ object or a torch tensor");
  }
  CopyArg a;
  a.sized = true;
  a.address = reinterpret_cast<uintptr_t>(view.buf);
  a.bytes = static_cast<size_t>(view.len);
  PyBuffer_Release(&view);  // the caller keeps obj alive for the copy
  return a;
}

}  // namespace

CopyArg resolve_copy_arg(nb::handle obj, bool writable, const char* role) {
  if (PyLong_CheckExact(obj.ptr())) {
    CopyArg a;
    a.address = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(obj.ptr()));
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw InvalidArgument(std::string(role) + "=" + nb::cast<std::string>(nb::str(obj)) +
                            ": an address is an integer from 0 to 2**64-1");
    }
    return a;
  }
  if (PyBool_Check(obj.ptr()))
    throw InvalidArgument(std::string(role) + "=" + arg_repr(obj) + ": a bool is not an address or a buffer");
  if (is_torch_tensor(obj)) return from_tensor(obj, role);
  if (nb::hasattr(obj, "__cuda_array_interface__"))
    return from_cuda_array_interface(obj.attr("__cuda_array_interface__"), role);
  return from_buffer(obj, writable, role);
}

std::vector<uintptr_t> addresses(nb::handle obj, const char* role) {
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    nb::sequence seq = nb::borrow<nb::sequence>(obj);
    const size_t n = nb::len(seq);
    std::vector<uintptr_t> out(n);
    PyObject** items = PySequence_Fast_ITEMS(obj.ptr());
    for (size_t i = 0; i < n; ++i) {
      PyObject* v = items[i];
      if (!PyLong_Check(v) || PyBool_Check(v))
        throw InvalidArgument(std::string(role) + "[" + std::to_string(i) + "]=" + arg_repr(v) +
                              ": expected an integer from 0 to 2**64-1");
      out[i] = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(v));
      if (PyErr_Occurred()) {
        PyErr_Clear();
        throw InvalidArgument(std::string(role) + "[" + std::to_string(i) + "]=" + arg_repr(v) +
                              ": expected an integer from 0 to 2**64-1");
      }
    }
    return out;
  }
  nb::ndarray<nb::ro, nb::ndim<1>, nb::device::cpu> a;
  if (!nb::try_cast(obj, a))
    throw InvalidArgument(std::string(role) + ": expected a list or a 1-d int64 array of addresses, not " +
                          python_type_name(obj));
  if (a.dtype() != nb::dtype<int64_t>() && a.dtype() != nb::dtype<uint64_t>())
    throw InvalidArgument(std::string(role) + ": an array of addresses must hold int64 or uint64");
  std::vector<uintptr_t> out(a.shape(0));
  const auto* data = static_cast<const uint64_t*>(a.data());
  const int64_t stride = a.stride(0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uintptr_t>(data[i * stride]);
  return out;
}

std::vector<int64_t> block_ids(nb::handle obj, const char* role) {
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(obj.ptr()));
    PyObject** items = PySequence_Fast_ITEMS(obj.ptr());
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) {
      PyObject* v = items[i];
      long long x = -1;
      if (PyLong_CheckExact(v)) {
        x = PyLong_AsLongLong(v);
      } else if (!PyBool_Check(v) && !PyFloat_Check(v) && PyIndex_Check(v)) {  // numpy integers
        PyObject* index = PyNumber_Index(v);
        if (index) x = PyLong_AsLongLong(index), Py_DECREF(index);
      } else {
        throw InvalidArgument(std::string(role) + "[" + std::to_string(i) + "]=" + arg_repr(v) +
                              ": expected a block id (an integer)");
      }
      if (PyErr_Occurred()) {
        PyErr_Clear();
        throw InvalidArgument(std::string(role) + "[" + std::to_string(i) + "]=" + arg_repr(v) +
                              ": expected a block id (an integer from -2**63 to 2**63-1)");
      }
      out[i] = x;
    }
    return out;
  }
  nb::ndarray<nb::ro, nb::ndim<1>, nb::device::cpu> a;
  if (!nb::try_cast(obj, a))
    throw InvalidArgument(std::string(role) + ": expected a list or a 1-d int32/int64 array of block ids, not " +
                          python_type_name(obj));
  std::vector<int64_t> out(a.shape(0));
  const int64_t stride = a.stride(0);
  if (a.dtype() == nb::dtype<int64_t>()) {
    const auto* data = static_cast<const int64_t*>(a.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = data[i * stride];
  } else if (a.dtype() == nb::dtype<int32_t>()) {
    const auto* data = static_cast<const int32_t*>(a.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = data[i * stride];
  } else {
    throw InvalidArgument(std::string(role) + ": an array of block ids must hold int32 or int64");
  }
  return out;
}

namespace {

// A stream the caller named (an int, a torch stream, torch's current stream):
// handle 0 is then the legacy default stream itself, which later work on it
// waits for. Only "no stream" (None, no torch tensor) is nullptr, the engine's
// choice of stream (copy_engine.h).
cudaStream_t named_stream(uintptr_t handle) {
  // cudaStreamLegacy is ((cudaStream_t)0x1) (driver_types.h; the bindings
  // include no CUDA header).
  return reinterpret_cast<cudaStream_t>(handle == 0 ? uintptr_t{1} : handle);
}

}  // namespace

cudaStream_t stream_of(nb::handle stream, int torch_device) {
  if (stream.is_none()) {
    if (torch_device < 0) return nullptr;
    // torch's current stream on that device, without making a Stream object.
    return named_stream(torch_current_stream(torch_device));
  }
  // A handle is an address: 0 .. 2**64-1 (stream=-1 or 2**64 was a std::bad_cast).
  if (PyLong_Check(stream.ptr()) && !PyBool_Check(stream.ptr()))
    return named_stream(int_arg<uintptr_t>(stream, "stream"));
  if (nb::hasattr(stream, "cuda_stream"))
    return named_stream(int_arg<uintptr_t>(stream.attr("cuda_stream"), "stream.cuda_stream"));
  throw InvalidArgument(std::string("stream must be an int handle or a torch.cuda.Stream, not ") + python_type_name(stream));
}

}  // namespace ferry::python
