// copy_bindings.cpp — ferry._ferry's copies: the process's engine per device,
// object-level calls (copy, copy_async, copy_many: tensors, buffers, arrays or
// ints, resolved in C++ by copy_args.h), the Engine class (addresses as ints,
// for benchmarks and private engines), Copy and Registration.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>

#include "core/crew.h"
#include "core/error.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/pointer_lookup.h"
#include "cuda/registration.h"
#include "os/memory.h"
#include "python/args.h"
#include "python/copy_args.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {
namespace {

constexpr int kMaxDevices = 64;

Strategy strategy_of(nb::handle h) {
  if (h.is_none()) return Strategy::automatic;
  if (!nb::isinstance<nb::str>(h))
    throw InvalidArgument("strategy must be a string such as 'staged' or None, not " +
                          std::string(Py_TYPE(h.ptr())->tp_name));
  return parse_strategy(nb::cast<std::string>(h));
}

void* ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

// The process's engine for `device`, made on first use and kept for the life
// of the process (never destroyed at exit, when the driver may be gone).
cuda::CopyEngine& engine_for(int device) {
  static std::once_flag made[kMaxDevices];
  static cuda::CopyEngine* engines[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices)
    throw InvalidArgument("device=" + std::to_string(device) + ": expected 0.." + std::to_string(kMaxDevices - 1));
  std::call_once(made[device], [&] {  // a constructor that throws leaves the flag unset: the next call retries
    engines[device] = new cuda::CopyEngine(cuda::CopyEngineOptions::from_environment(device));
  });
  return *engines[device];
}

// The device of a device pointer, or -1 (host memory, managed memory, unknown).
int device_of(uintptr_t p) {
  cuda::PointerLookup lookup;
  return lookup.find(ptr(p)).device;
}

// One copy's arguments, resolved.
struct Prepared {
  void* dst;
  const void* src;
  size_t n;
  int device;
  cudaStream_t stream;
};

Prepared prepare(nb::handle dst, nb::handle src, nb::handle nbytes, nb::handle stream, nb::handle device) {
  const CopyArg d = resolve_copy_arg(dst, true, "dst"), s = resolve_copy_arg(src, false, "src");
  size_t n;
  if (!nbytes.is_none()) {
    n = size_arg(nbytes, "nbytes");
  } else if (d.sized && s.sized) {
    if (d.bytes != s.bytes)
      throw InvalidArgument("dst has " + std::to_string(d.bytes) + " bytes and src " + std::to_string(s.bytes) +
                            ": pass nbytes to copy a prefix");
    n = d.bytes;
  } else if (d.sized || s.sized) {
    n = d.sized ? d.bytes : s.bytes;
  } else {
    throw InvalidArgument("an address given as an int needs nbytes");
  }
  if ((d.sized && n > d.bytes) || (s.sized && n > s.bytes))
    throw InvalidArgument("nbytes=" + std::to_string(n) + " is larger than dst (" + std::to_string(d.bytes) +
                          " bytes) or src (" + std::to_string(s.bytes) + " bytes)");
  int dev = d.cuda_device >= 0 ? d.cuda_device : s.cuda_device;
  const int torch_device = (d.torch || s.torch) ? dev : -1;
  if (!device.is_none()) {
    const int asked = int_arg<int>(device, "device", 0, INT32_MAX);
    if (dev >= 0 && dev != asked)
      throw InvalidArgument("device=" + std::to_string(asked) + " but the tensor is on cuda:" + std::to_string(dev));
    dev = asked;
  }
  if (dev < 0) dev = device_of(d.address);
  if (dev < 0) dev = device_of(s.address);
  if (dev < 0) dev = 0;
  return {ptr(d.address), reinterpret_cast<const void*>(s.address), n, dev, stream_of(stream, torch_device)};
}

// Items of one copy_many call.
struct PreparedMany {
  std::vector<cuda::CopyOp> ops;
  int device = -1;
  int torch_device = -1;
};

bool is_address_list(nb::handle obj) {
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    if (PySequence_Fast_GET_SIZE(obj.ptr()) == 0) return true;
    PyObject* first = PySequence_Fast_ITEMS(obj.ptr())[0];
    return PyLong_Check(first) && !PyBool_Check(first);
  }
  return nb::hasattr(obj, "__dlpack__") || nb::hasattr(obj, "__array_interface__");
}

PreparedMany prepare_many(nb::handle dsts, nb::handle srcs, nb::handle sizes) {
  PreparedMany m;
  std::vector<uintptr_t> byte_counts;
  if (!sizes.is_none()) byte_counts = addresses(sizes, "sizes");
  if (is_address_list(dsts) && is_address_list(srcs)) {
    // The fast path: addresses only (a KV-cache's blocks).
    std::vector<uintptr_t> d = addresses(dsts, "dsts"), s = addresses(srcs, "srcs");
    if (sizes.is_none()) throw InvalidArgument("copy_many with addresses needs sizes");
    if (d.size() != s.size() || d.size() != byte_counts.size())
      throw InvalidArgument("copy_many: dsts, srcs and sizes have " + std::to_string(d.size()) + ", " +
                            std::to_string(s.size()) + " and " + std::to_string(byte_counts.size()) + " items");
    m.ops.resize(d.size());
    for (size_t i = 0; i < d.size(); ++i) m.ops[i] = {ptr(d[i]), reinterpret_cast<const void*>(s[i]), byte_counts[i]};
    return m;
  }
  nb::sequence ds = nb::cast<nb::sequence>(dsts), ss = nb::cast<nb::sequence>(srcs);
  const size_t n = nb::len(ds);
  if (nb::len(ss) != n || (!sizes.is_none() && byte_counts.size() != n))
    throw InvalidArgument("copy_many: dsts has " + std::to_string(n) + " items, srcs " + std::to_string(nb::len(ss)) +
                          (sizes.is_none() ? "" : ", sizes " + std::to_string(byte_counts.size())));
  m.ops.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string di = "dsts[" + std::to_string(i) + "]", si = "srcs[" + std::to_string(i) + "]";
    const CopyArg d = resolve_copy_arg(ds[i], true, di.c_str()), s = resolve_copy_arg(ss[i], false, si.c_str());
    size_t bytes;
    if (!sizes.is_none()) {
      bytes = byte_counts[i];
      if ((d.sized && bytes > d.bytes) || (s.sized && bytes > s.bytes))
        throw InvalidArgument("item " + std::to_string(i) + ": sizes[" + std::to_string(i) + "]=" +
                              std::to_string(bytes) + " is larger than its dst or src");
    } else if (d.sized && s.sized) {
      if (d.bytes != s.bytes)
        throw InvalidArgument("item " + std::to_string(i) + ": dst has " + std::to_string(d.bytes) + " bytes and src " +
                              std::to_string(s.bytes) + " (pass sizes to copy prefixes)");
      bytes = d.bytes;
    } else {
      throw InvalidArgument("item " + std::to_string(i) + ": an address given as an int needs sizes");
    }
    for (const CopyArg* a : {&d, &s}) {
      if (a->cuda_device < 0) continue;
      if (m.device >= 0 && m.device != a->cuda_device)
        throw InvalidArgument("item " + std::to_string(i) + " is on cuda:" + std::to_string(a->cuda_device) +
                              " but earlier items are on cuda:" + std::to_string(m.device) +
                              ": one copy_many call serves one device");
      m.device = a->cuda_device;
      if (a->torch) m.torch_device = a->cuda_device;
    }
    m.ops[i] = {ptr(d.address), reinterpret_cast<const void*>(s.address), bytes};
  }
  return m;
}

// Returns None (wait) or the Copy.
nb::object run_many(nb::handle dsts, nb::handle srcs, nb::handle sizes, nb::handle stream, nb::handle strategy,
                    nb::handle device, bool wait) {
  PreparedMany m = prepare_many(dsts, srcs, sizes);
  if (m.ops.empty()) throw InvalidArgument("copy_many: no items");
  int dev = m.device;
  if (!device.is_none()) {
    const int asked = int_arg<int>(device, "device", 0, INT32_MAX);
    if (dev >= 0 && dev != asked)
      throw InvalidArgument("device=" + std::to_string(asked) + " but the tensors are on cuda:" + std::to_string(dev));
    dev = asked;
  }
  for (size_t i = 0; dev < 0 && i < m.ops.size() && i < 4; ++i) {
    dev = device_of(reinterpret_cast<uintptr_t>(m.ops[i].dst));
    if (dev < 0) dev = device_of(reinterpret_cast<uintptr_t>(m.ops[i].src));
  }
  if (dev < 0) dev = 0;
  const cudaStream_t s = stream_of(stream, m.torch_device);
  const Strategy st = strategy_of(strategy);
  cuda::CopyEngine& e = engine_for(dev);
  cuda::Completion c;
  {
    ferry::python::GilRelease unlocked;
    if (wait)
      e.copy_many(m.ops, s, st);
    else
      c = e.copy_many_async(m.ops, s, st);
  }
  return wait ? nb::none() : nb::cast(std::move(c));
}

nb::dict stats_dict(const cuda::CopyEngineStats& s) {
  nb::dict d;
  d["copies"] = s.copies;
  d["bytes"] = s.bytes;
  d["chunks"] = s.chunks;
  d["pinned_pieces"] = s.pinned_pieces;
  d["eager_runs"] = s.eager_runs;
  nb::dict by;
  for (int i = 0; i < kStrategyCount; ++i) by[strategy_name(static_cast<Strategy>(i))] = s.by_strategy[i];
  d["by_strategy"] = by;
  return d;
}

std::vector<cuda::CopyOp> int_ops(const std::vector<uintptr_t>& dsts, const std::vector<uintptr_t>& srcs,
                                  const std::vector<uintptr_t>& sizes) {
  if (dsts.size() != srcs.size() || dsts.size() != sizes.size())
    throw InvalidArgument("batch: dsts, srcs and sizes must have the same length");
  std::vector<cuda::CopyOp> ops(dsts.size());
  for (size_t i = 0; i < ops.size(); ++i) ops[i] = {ptr(dsts[i]), ptr(srcs[i]), sizes[i]};
  return ops;
}

}  // namespace

void bind_copy(nb::module_& m) {
  m.def("buffer_address",
        [](nb::handle obj, bool writable) {
          const CopyArg a = resolve_copy_arg(obj, writable, "obj");
          return nb::make_tuple(a.address, a.bytes, false);
        },
        "obj"_a, "writable"_a = false);
  m.def("resolve_copy_arg",
        [](nb::handle obj, bool writable) {
          const CopyArg a = resolve_copy_arg(obj, writable, "obj");
          return nb::make_tuple(a.address, a.sized ? nb::cast(a.bytes) : nb::none(),
                                a.cuda_device >= 0 ? nb::cast(a.cuda_device) : nb::none());
        },
        "obj"_a, "writable"_a = false,
        "(address, nbytes or None, cuda device or None) of a copy argument.");

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

  // Object-level calls (python/ferry/copy.py).
  m.def("copy",
        [](nb::handle dst, nb::handle src, nb::handle nbytes, nb::handle stream, nb::handle strategy,
           nb::handle device) {
          const Prepared p = prepare(dst, src, nbytes, stream, device);
          const Strategy s = strategy_of(strategy);
          cuda::CopyEngine& e = engine_for(p.device);
          ferry::python::GilRelease unlocked;
          e.copy(p.dst, p.src, p.n, s, p.stream);
        },
        "dst"_a, "src"_a, "nbytes"_a = nb::none(), "stream"_a = nb::none(), "strategy"_a = nb::none(),
        "device"_a = nb::none());
  m.def("copy_async",
        [](nb::handle dst, nb::handle src, nb::handle nbytes, nb::handle stream, nb::handle strategy,
           nb::handle device) {
          const Prepared p = prepare(dst, src, nbytes, stream, device);
          const Strategy s = strategy_of(strategy);
          cuda::CopyEngine& e = engine_for(p.device);
          ferry::python::GilRelease unlocked;
          return e.copy_async(p.dst, p.src, p.n, p.stream, s);
        },
        "dst"_a, "src"_a, "nbytes"_a = nb::none(), "stream"_a = nb::none(), "strategy"_a = nb::none(),
        "device"_a = nb::none());
  m.def("copy_many",
        [](nb::handle dsts, nb::handle srcs, nb::handle sizes, nb::handle stream, nb::handle strategy,
           nb::handle device, bool wait) { return run_many(dsts, srcs, sizes, stream, strategy, device, wait); },
        "dsts"_a, "srcs"_a, "sizes"_a = nb::none(), "stream"_a = nb::none(), "strategy"_a = nb::none(),
        "device"_a = nb::none(), "wait"_a = true);
  m.def("advise_huge",
        [](uintptr_t address, size_t nbytes) {
          // The whole 2 MiB pages inside [address, address + nbytes).
          const uintptr_t huge = uintptr_t{2} << 20;
          const uintptr_t begin = (address + huge - 1) & ~(huge - 1), end = (address + nbytes) & ~(huge - 1);
          return end > begin && os::advise_huge(ptr(begin), end - begin) == 0;
        },
        "address"_a, "nbytes"_a,
        "Ask for transparent huge pages in the whole 2 MiB pages of a range not yet touched (advice: "
        "False where the kernel refuses). First touch of fresh memory is 3x faster with them in a VM.");
  m.def("engine", &engine_for, "device"_a = 0, nb::rv_policy::reference,
        "The process's copy engine for `device` (made on first use).");

  nb::class_<cuda::CopyEngine>(m, "Engine")
      .def("__init__",
           [](cuda::CopyEngine* e, int device) {
             auto o = cuda::CopyEngineOptions::from_environment(device);
             ferry::python::GilRelease unlocked;
             new (e) cuda::CopyEngine(o);
           },
           "device"_a = 0)
      .def("copy",
           [](cuda::CopyEngine& e, uintptr_t dst, uintptr_t src, size_t n, nb::handle strategy, uintptr_t stream) {
             Strategy s = strategy_of(strategy);
             ferry::python::GilRelease unlocked;
             e.copy(ptr(dst), ptr(src), n, s, reinterpret_cast<cudaStream_t>(stream));
           },
           "dst"_a, "src"_a, "nbytes"_a, "strategy"_a = nb::none(), "stream"_a = 0)
      .def("copy_async",
           [](cuda::CopyEngine& e, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream, nb::handle strategy) {
             Strategy s = strategy_of(strategy);
             ferry::python::GilRelease unlocked;
             return e.copy_async(ptr(dst), ptr(src), n, reinterpret_cast<cudaStream_t>(stream), s);
           },
           "dst"_a, "src"_a, "nbytes"_a, "stream"_a = 0, "strategy"_a = nb::none())
      .def("copy_many_async",
           [](cuda::CopyEngine& e, nb::handle dsts, nb::handle srcs, nb::handle sizes, uintptr_t stream,
              nb::handle strategy) {
             auto ops = int_ops(addresses(dsts, "dsts"), addresses(srcs, "srcs"), addresses(sizes, "sizes"));
             Strategy s = strategy_of(strategy);
             ferry::python::GilRelease unlocked;
             return e.copy_many_async(ops, reinterpret_cast<cudaStream_t>(stream), s);
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
      .def("stats",
           [](const cuda::CopyEngine& e) {
             nb::dict d = stats_dict(e.stats());  // refuses in a forked child
             // Placement, fixed at creation: the host NUMA node the engine serves its
             // device from (-1: none) and its crew (threads counting the caller; the
             // CPUs they are bound to, [] when not bound).
             d["numa_node"] = e.numa_node();
             d["crew_threads"] = e.crew().threads() + 1;
             d["crew_cpus"] = e.crew().cpus();
             return d;
           })
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
