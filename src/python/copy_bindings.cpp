// copy_bindings.cpp — ferry._ferry.Engine / Copy / Registration and
// buffer_address(). Addresses are plain ints here; python/ferry/copy.py turns
// buffers, arrays and tensors into them and keeps them alive.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "core/error.h"
#include "cuda/copy_engine.h"
#include "cuda/registration.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {
namespace {

Strategy strategy_of(nb::handle h) {
  if (h.is_none()) return Strategy::automatic;
  return parse_strategy(nb::cast<std::string>(h));
}

void* ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

// (address, nbytes, readonly) of any object with the buffer protocol.
nb::tuple buffer_address(nb::handle obj, bool writable) {
  Py_buffer view;
  int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) throw nb::python_error();
  nb::tuple t = nb::make_tuple(reinterpret_cast<uintptr_t>(view.buf), static_cast<size_t>(view.len),
                               static_cast<bool>(view.readonly));
  PyBuffer_Release(&view);
  return t;
}

nb::dict stats_dict(const cuda::CopyEngineStats& s) {
  nb::dict d;
  d["copies"] = s.copies;
  d["bytes"] = s.bytes;
  d["chunks"] = s.chunks;
  d["pinned_pieces"] = s.pinned_pieces;
  nb::dict by;
  for (int i = 0; i < kStrategyCount; ++i) by[strategy_name(static_cast<Strategy>(i))] = s.by_strategy[i];
  d["by_strategy"] = by;
  return d;
}

}  // namespace

void bind_copy(nb::module_& m) {
  m.def("buffer_address", &buffer_address, "obj"_a, "writable"_a = false);

  nb::class_<cuda::Completion>(m, "Copy")
      .def("wait",
           [](cuda::Completion& c) {
             ferry::python::GilRelease unlocked;
             c.wait();
           })
      .def("query", [](cuda::Completion& c) { return c.query(); })
      .def_prop_ro("strategy", [](const cuda::Completion& c) { return std::string(strategy_name(c.strategy())); })
      .def_prop_ro("event", [](const cuda::Completion& c) { return reinterpret_cast<uintptr_t>(c.event()); })
      .def_prop_ro("nbytes", &cuda::Completion::bytes)
      .def_prop_ro("seconds", &cuda::Completion::seconds);

  nb::class_<cuda::CopyEngine>(m, "Engine")
      .def("__init__",
           [](cuda::CopyEngine* e, int device) {
             auto o = cuda::CopyEngineOptions::from_environment(device);
             ferry::python::GilRelease unlocked;
             new (e) cuda::CopyEngine(o);
           },
           "device"_a = 0)
      .def("copy",
           [](cuda::CopyEngine& e, uintptr_t dst, uintptr_t src, size_t n, nb::handle strategy) {
             Strategy s = strategy_of(strategy);
             ferry::python::GilRelease unlocked;
             e.copy(ptr(dst), ptr(src), n, s);
           },
           "dst"_a, "src"_a, "nbytes"_a, "strategy"_a = nb::none())
      .def("copy_async",
           [](cuda::CopyEngine& e, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream, nb::handle strategy) {
             Strategy s = strategy_of(strategy);
             ferry::python::GilRelease unlocked;
             return e.copy_async(ptr(dst), ptr(src), n, reinterpret_cast<cudaStream_t>(stream), s);
           },
           "dst"_a, "src"_a, "nbytes"_a, "stream"_a = 0, "strategy"_a = nb::none())
      .def("copy_batch_async",
           [](cuda::CopyEngine& e, std::vector<uintptr_t> dsts, std::vector<uintptr_t> srcs,
              std::vector<size_t> sizes, uintptr_t stream, nb::handle strategy) {
             if (dsts.size() != srcs.size() || dsts.size() != sizes.size())
               throw InvalidArgument("batch: dsts, srcs and sizes must have the same length");
             std::vector<cuda::CopyOp> ops(dsts.size());
             for (size_t i = 0; i < ops.size(); ++i) ops[i] = {ptr(dsts[i]), ptr(srcs[i]), sizes[i]};
             Strategy s = strategy_of(strategy);
             ferry::python::GilRelease unlocked;
             return e.copy_batch_async(ops, reinterpret_cast<cudaStream_t>(stream), s);
           },
           "dsts"_a, "srcs"_a, "sizes"_a, "stream"_a = 0, "strategy"_a = nb::none())
      .def("plan",
           [](cuda::CopyEngine& e, uintptr_t dst, uintptr_t src, size_t n, nb::handle strategy) {
             return std::string(strategy_name(e.plan(ptr(dst), ptr(src), n, strategy_of(strategy))));
           },
           "dst"_a, "src"_a, "nbytes"_a, "strategy"_a = nb::none())
      .def("warm_up",
           [](cuda::CopyEngine& e) {
             ferry::python::GilRelease unlocked;
             e.warm_up();
           })
      .def("stats", [](const cuda::CopyEngine& e) { return stats_dict(e.stats()); })
      .def_prop_ro("device", [](const cuda::CopyEngine& e) { return e.options().device; });

  nb::class_<cuda::Registration>(m, "Registration")
      .def("__init__",
           [](cuda::Registration* r, uintptr_t p, size_t n, int device) {
             ferry::python::GilRelease unlocked;
             new (r) cuda::Registration(ptr(p), n, device);
           },
           "ptr"_a, "nbytes"_a, "device"_a = 0)
      .def_prop_ro("base", [](const cuda::Registration& r) { return reinterpret_cast<uintptr_t>(r.base()); })
      .def_prop_ro("registered_bytes", &cuda::Registration::registered_bytes);
}

}  // namespace ferry::python
