// copy_bindings.cpp — ferry._ferry's copies: the process's engine per device,
// object-level calls (copy, copy_async, copy_many: tensors, buffers, arrays or
// ints, resolved in C++ by copy_args.h), the Engine class (addresses as ints,
// for benchmarks and private engines), Copy and Registration.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "copy/block_table.h"
#include "core/crew.h"
#include "core/error.h"
#include "cuda/copy/block_plan.h"
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
// Locking: made[d] serializes the making of engine d. The making sets up a CUDA
// context (seconds on a first call) without the GIL: other Python threads run
// meanwhile, and a second caller for the same device waits on the once_flag,
// never holding the GIL that the first would need back.
cuda::CopyEngine& engine_for(int device) {
  static std::once_flag made[kMaxDevices];
  static std::atomic<cuda::CopyEngine*> engines[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices)
    throw InvalidArgument("device=" + std::to_string(device) + ": expected 0.." + std::to_string(kMaxDevices - 1));
  if (cuda::CopyEngine* e = engines[device].load(std::memory_order_acquire)) return *e;
  ferry::python::GilRelease unlocked;
  std::call_once(made[device], [&] {  // a constructor that throws leaves the flag unset: the next call retries
    engines[device].store(new cuda::CopyEngine(cuda::CopyEngineOptions::from_environment(device)),
                          std::memory_order_release);
  });
  return *engines[device].load(std::memory_order_acquire);
}

// The device of a device pointer, or -1 (host memory, managed memory, unknown).
int device_of(uintptr_t p) {
  cuda::PointerLookup lookup;
  return lookup.find(ptr(p)).device;
}

// The resolved items of a copy or copy_many call: what they copy, the device
// whose engine serves them and the stream.
struct Prepared {
  std::vector<cuda::CopyOp> ops;
  int device = -1;
  cudaStream_t stream = nullptr;
};

// How many bytes one item copies. `given`: nbytes / sizes[i] when passed.
// Without it, both sides' sizes must agree; with one side an int address, the
// other side's size is taken when `one_sized_side_will_do` (copy, not copy_many).
size_t item_bytes(const CopyArg& d, const CopyArg& s, const size_t* given, bool one_sized_side_will_do,
                  const std::string& item, const char* size_name) {
  if (given) {
    if ((d.sized && *given > d.bytes) || (s.sized && *given > s.bytes))
      throw InvalidArgument(item + size_name + "=" + std::to_string(*given) + " is larger than dst (" +
                            std::to_string(d.bytes) + " bytes) or src (" + std::to_string(s.bytes) + " bytes)");
    return *given;
  }
  if (d.sized && s.sized) {
    if (d.bytes != s.bytes)
      throw InvalidArgument(item + "dst has " + std::to_string(d.bytes) + " bytes and src " + std::to_string(s.bytes) +
                            ": pass " + (one_sized_side_will_do ? "nbytes to copy a prefix" : "sizes to copy prefixes"));
    return d.bytes;
  }
  if (one_sized_side_will_do && (d.sized || s.sized)) return d.sized ? d.bytes : s.bytes;
  throw InvalidArgument(item + "an address given as an int needs " + size_name);
}

// The one device resolution of copy and copy_many: the CUDA device of the
// tensors and arrays (one device per call), checked against `device=`, else
// `device=`, else the driver's answer for the first items' pointers, else 0.
// The stream: torch's current stream when a torch CUDA tensor is involved.
Prepared prepare(std::vector<CopyArg>& dsts, std::vector<CopyArg>& srcs, const std::vector<size_t>* sizes,
                 bool single, nb::handle stream, nb::handle device) {
  Prepared p;
  int found = -1, torch_device = -1;
  p.ops.resize(dsts.size());
  for (size_t i = 0; i < dsts.size(); ++i) {
    const std::string item = single ? "" : "item " + std::to_string(i) + ": ";
    const std::string size_name = single ? "nbytes" : "sizes[" + std::to_string(i) + "]";
    const size_t n = item_bytes(dsts[i], srcs[i], sizes ? &(*sizes)[i] : nullptr, single, item,
                                sizes || single ? size_name.c_str() : "sizes");
    for (const CopyArg* a : {&dsts[i], &srcs[i]}) {
      if (a->cuda_device < 0) continue;
      if (found >= 0 && found != a->cuda_device)
        throw InvalidArgument(item + "on cuda:" + std::to_string(a->cuda_device) + " and cuda:" +
                              std::to_string(found) + ": one call serves one device");
      found = a->cuda_device;
      if (a->torch) torch_device = a->cuda_device;
    }
    p.ops[i] = {ptr(dsts[i].address), reinterpret_cast<const void*>(srcs[i].address), n};
  }
  if (!device.is_none()) {
    const int asked = int_arg<int>(device, "device", 0, INT32_MAX);
    if (found >= 0 && found != asked)
      throw InvalidArgument("device=" + std::to_string(asked) + " but the data is on cuda:" + std::to_string(found));
    found = asked;
  }
  for (size_t i = 0; found < 0 && i < p.ops.size() && i < 4; ++i) {
    found = device_of(reinterpret_cast<uintptr_t>(p.ops[i].dst));
    if (found < 0) found = device_of(reinterpret_cast<uintptr_t>(p.ops[i].src));
  }
  p.device = found < 0 ? 0 : found;
  p.stream = stream_of(stream, torch_device);
  return p;
}

// copy / copy_async: one item.
Prepared prepare_one(nb::handle dst, nb::handle src, nb::handle nbytes, nb::handle stream, nb::handle device) {
  std::vector<CopyArg> d{resolve_copy_arg(dst, true, "dst")}, s{resolve_copy_arg(src, false, "src")};
  std::vector<size_t> n;
  if (!nbytes.is_none()) n.push_back(size_arg(nbytes, "nbytes"));
  return prepare(d, s, nbytes.is_none() ? nullptr : &n, true, stream, device);
}

// copy and copy_async: the arguments checked (the strategy first: preparing
// may ask the driver), then go(engine, op, strategy, stream) without the GIL.
template <class Go>
auto run_one(nb::handle dst, nb::handle src, nb::handle nbytes, nb::handle stream, nb::handle strategy,
             nb::handle device, Go go) {
  const Strategy s = strategy_of(strategy);
  const Prepared p = prepare_one(dst, src, nbytes, stream, device);
  cuda::CopyEngine& e = engine_for(p.device);
  ferry::python::GilRelease unlocked;
  return go(e, p.ops[0], s, p.stream);
}

bool is_address_list(nb::handle obj) {
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    if (PySequence_Fast_GET_SIZE(obj.ptr()) == 0) return true;
    PyObject* first = PySequence_Fast_ITEMS(obj.ptr())[0];
    return PyLong_Check(first) && !PyBool_Check(first);
  }
  return nb::hasattr(obj, "__dlpack__") || nb::hasattr(obj, "__array_interface__");
}

// copy_many: lists (tuples, generators, any iterable) of objects, or lists or
// int64 arrays of addresses (a KV-cache's blocks) with sizes.
Prepared prepare_many(nb::handle dsts, nb::handle srcs, nb::handle sizes, nb::handle stream, nb::handle device) {
  std::vector<size_t> byte_counts;
  if (!sizes.is_none()) {
    const std::vector<uintptr_t> given = addresses(sizes, "sizes");
    byte_counts.assign(given.begin(), given.end());
  }
  std::vector<CopyArg> d, s;
  if (is_address_list(dsts) && is_address_list(srcs)) {
    if (sizes.is_none()) throw InvalidArgument("copy_many with addresses needs sizes");
    for (uintptr_t a : addresses(dsts, "dsts")) d.push_back(CopyArg{.address = a});
    for (uintptr_t a : addresses(srcs, "srcs")) s.push_back(CopyArg{.address = a});
  } else {
    nb::list ds = items_arg(dsts, "dsts", "a sequence of tensors, buffers or addresses");
    nb::list ss = items_arg(srcs, "srcs", "a sequence of tensors, buffers or addresses");
    if (ds.size() != ss.size())
      throw InvalidArgument("copy_many: dsts has " + std::to_string(ds.size()) + " items, srcs " +
                            std::to_string(ss.size()));
    for (size_t i = 0; i < ds.size(); ++i) {
      const std::string di = "dsts[" + std::to_string(i) + "]", si = "srcs[" + std::to_string(i) + "]";
      d.push_back(resolve_copy_arg(ds[i], true, di.c_str()));
      s.push_back(resolve_copy_arg(ss[i], false, si.c_str()));
    }
  }
  if (d.size() != s.size() || (!sizes.is_none() && byte_counts.size() != d.size()))
    throw InvalidArgument("copy_many: dsts, srcs and sizes have " + std::to_string(d.size()) + ", " +
                          std::to_string(s.size()) + " and " +
                          (sizes.is_none() ? std::string("no") : std::to_string(byte_counts.size())) + " items");
  if (d.empty()) throw InvalidArgument("copy_many: no items");
  return prepare(d, s, sizes.is_none() ? nullptr : &byte_counts, false, stream, device);
}

// copy_many with addresses (lists or int64 arrays; sizes an array or one int
// for every item): straight to CopyOps, no per-item Python or CopyArg objects
// (a KV connector's 64,000 blocks cost a few ns each here).
Prepared prepare_addresses(nb::handle dsts, nb::handle srcs, nb::handle sizes, nb::handle stream,
                           nb::handle device) {
  if (sizes.is_none()) throw InvalidArgument("copy_many with addresses needs sizes");
  const std::vector<uintptr_t> d = addresses(dsts, "dsts"), s = addresses(srcs, "srcs");
  const bool one_size = PyLong_Check(sizes.ptr()) && !PyBool_Check(sizes.ptr());
  std::vector<uintptr_t> n;
  if (one_size)
    n.assign(d.size(), size_arg(sizes, "sizes"));
  else
    n = addresses(sizes, "sizes");
  if (d.size() != s.size() || n.size() != d.size())
    throw InvalidArgument("copy_many: dsts, srcs and sizes have " + std::to_string(d.size()) + ", " +
                          std::to_string(s.size()) + " and " + std::to_string(n.size()) + " items");
  if (d.empty()) throw InvalidArgument("copy_many: no items");
  Prepared p;
  p.ops.resize(d.size());
  for (size_t i = 0; i < d.size(); ++i) p.ops[i] = {ptr(d[i]), reinterpret_cast<const void*>(s[i]), n[i]};
  int found = device.is_none() ? -1 : int_arg<int>(device, "device", 0, INT32_MAX);
  for (size_t i = 0; found < 0 && i < p.ops.size() && i < 4; ++i) {
    found = device_of(reinterpret_cast<uintptr_t>(p.ops[i].dst));
    if (found < 0) found = device_of(reinterpret_cast<uintptr_t>(p.ops[i].src));
  }
  p.device = found < 0 ? 0 : found;
  p.stream = stream_of(stream, -1);
  return p;
}

// Runs a prepared copy_many: None (wait) or the Copy.
nb::object run_prepared(Prepared& p, Strategy st, bool wait) {
  cuda::CopyEngine& e = engine_for(p.device);
  cuda::Completion c;
  {
    ferry::python::GilRelease unlocked;
    if (wait)
      e.copy_many(p.ops, p.stream, st);
    else
      c = e.copy_many_async(p.ops, p.stream, st);
  }
  return wait ? nb::none() : nb::cast(std::move(c));
}

// copy_blocks: a block table (copy/block_table.h) expanded here, in C++.
nb::object run_blocks(nb::handle dst_base, nb::handle src_base, nb::handle dst_ids, nb::handle src_ids,
                      nb::handle block_bytes, nb::handle layers, nb::handle dst_block_stride,
                      nb::handle src_block_stride, nb::handle dst_layer_stride, nb::handle src_layer_stride,
                      nb::handle stream, nb::handle strategy, nb::handle device, bool wait) {
  const Strategy st = strategy_of(strategy);
  const std::vector<int64_t> di = block_ids(dst_ids, "dst_ids"), si = block_ids(src_ids, "src_ids");
  BlockTable t;
  t.block_bytes = size_arg(block_bytes, "block_bytes");
  t.layers = layers.is_none() ? 1 : size_arg(layers, "layers");
  t.dst = {int_arg<uintptr_t>(dst_base, "dst_base"),
           dst_block_stride.is_none() ? t.block_bytes : size_arg(dst_block_stride, "dst_block_stride"),
           dst_layer_stride.is_none() ? 0 : size_arg(dst_layer_stride, "dst_layer_stride")};
  t.src = {int_arg<uintptr_t>(src_base, "src_base"),
           src_block_stride.is_none() ? t.block_bytes : size_arg(src_block_stride, "src_block_stride"),
           src_layer_stride.is_none() ? 0 : size_arg(src_layer_stride, "src_layer_stride")};
  if (t.layers > 1 && (dst_layer_stride.is_none() || src_layer_stride.is_none()))
    throw InvalidArgument("layers=" + std::to_string(t.layers) + " needs dst_layer_stride and src_layer_stride");
  t.dst_ids = di;
  t.src_ids = si;
  check_block_table(t);
  Prepared p;
  p.ops.reserve(block_table_items(t));
  for_each_block(t, [&](uintptr_t d, uintptr_t s, size_t n) { p.ops.push_back({ptr(d), ptr(s), n}); });
  int found = device.is_none() ? -1 : int_arg<int>(device, "device", 0, INT32_MAX);
  if (found < 0) found = device_of(t.dst.base);
  if (found < 0) found = device_of(t.src.base);
  p.device = found < 0 ? 0 : found;
  p.stream = stream_of(stream, -1);
  return run_prepared(p, st, wait);
}

// Returns None (wait) or the Copy.
nb::object run_many(nb::handle dsts, nb::handle srcs, nb::handle sizes, nb::handle stream, nb::handle strategy,
                    nb::handle device, bool wait) {
  const Strategy st = strategy_of(strategy);  // arguments first: prepare may ask the driver
  Prepared p = is_address_list(dsts) && is_address_list(srcs) ? prepare_addresses(dsts, srcs, sizes, stream, device)
                                                              : prepare_many(dsts, srcs, sizes, stream, device);
  return run_prepared(p, st, wait);
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

// Addresses as ints (benchmarks, private engines); every argument is checked
// by args.h (a wrong type is an InvalidArgumentError naming it).
void* int_address(nb::handle h, const char* name) { return ptr(int_arg<uintptr_t>(h, name)); }
// The engine's own calls: a stream as an int, or None (as 0: the engine's stream for
// the direction, not the legacy stream; CopyEngine::copy_many_async).
cudaStream_t int_stream(nb::handle h) {
  return h.is_none() ? nullptr : reinterpret_cast<cudaStream_t>(int_arg<uintptr_t>(h, "stream"));
}

nb::dict engine_stats(const cuda::CopyEngine& e) {
  nb::dict d = stats_dict(e.stats());  // refuses in a forked child
  // Placement, fixed at creation: the host NUMA node the engine serves its
  // device from (-1: none) and its crew (threads counting the caller; the
  // CPUs they are bound to, [] when not bound).
  d["numa_node"] = e.numa_node();
  d["crew_threads"] = e.crew().threads() + 1;
  d["crew_cpus"] = e.crew().cpus();
  return d;
}

// What a copy argument resolves to (copy_args.h), and the huge-page hint.
void bind_copy_args(nb::module_& m) {
  m.def("buffer_address",
        [](nb::handle obj, bool writable) {
          const CopyArg a = resolve_copy_arg(obj, writable, "obj");
          return nb::make_tuple(a.address, a.bytes, false);
        },
        "obj"_a.none(), "writable"_a = false);
  m.def("resolve_copy_arg",
        [](nb::handle obj, bool writable) {
          const CopyArg a = resolve_copy_arg(obj, writable, "obj");
          return nb::make_tuple(a.address, a.sized ? nb::cast(a.bytes) : nb::none(),
                                a.cuda_device >= 0 ? nb::cast(a.cuda_device) : nb::none());
        },
        "obj"_a.none(), "writable"_a = false,
        "(address, nbytes or None, cuda device or None) of a copy argument.");
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
}

// The Copy a copy_async returns (cuda::Completion).
void bind_completion(nb::module_& m) {
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
}

// Object-level calls (python/ferry/copy.py) on the process's engines.
void bind_copy_calls(nb::module_& m) {
  m.def("copy",
        [](nb::handle dst, nb::handle src, nb::handle nbytes, nb::handle stream, nb::handle strategy,
           nb::handle device) {
          run_one(dst, src, nbytes, stream, strategy, device,
                  [](cuda::CopyEngine& e, const cuda::CopyOp& op, Strategy s, cudaStream_t st) {
                    e.copy(op.dst, op.src, op.bytes, st, s);
                  });
        },
        "dst"_a.none(), "src"_a.none(), "nbytes"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
        "strategy"_a.none() = nb::none(), "device"_a.none() = nb::none());
  m.def("copy_async",
        [](nb::handle dst, nb::handle src, nb::handle nbytes, nb::handle stream, nb::handle strategy,
           nb::handle device) {
          return run_one(dst, src, nbytes, stream, strategy, device,
                         [](cuda::CopyEngine& e, const cuda::CopyOp& op, Strategy s, cudaStream_t st) {
                           return e.copy_async(op.dst, op.src, op.bytes, st, s);
                         });
        },
        "dst"_a.none(), "src"_a.none(), "nbytes"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
        "strategy"_a.none() = nb::none(), "device"_a.none() = nb::none());
  m.def("copy_many",
        [](nb::handle dsts, nb::handle srcs, nb::handle sizes, nb::handle stream, nb::handle strategy,
           nb::handle device, bool wait) { return run_many(dsts, srcs, sizes, stream, strategy, device, wait); },
        "dsts"_a.none(), "srcs"_a.none(), "sizes"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
        "strategy"_a.none() = nb::none(), "device"_a.none() = nb::none(), "wait"_a = true);
  m.def("copy_blocks",
        [](nb::handle dst_base, nb::handle src_base, nb::handle dst_ids, nb::handle src_ids, nb::handle block_bytes,
           nb::handle layers, nb::handle dst_block_stride, nb::handle src_block_stride, nb::handle dst_layer_stride,
           nb::handle src_layer_stride, nb::handle stream, nb::handle strategy, nb::handle device, bool wait) {
          return run_blocks(dst_base, src_base, dst_ids, src_ids, block_bytes, layers, dst_block_stride,
                            src_block_stride, dst_layer_stride, src_layer_stride, stream, strategy, device, wait);
        },
        "dst_base"_a.none(), "src_base"_a.none(), "dst_ids"_a.none(), "src_ids"_a.none(), "block_bytes"_a.none(),
        "layers"_a.none() = nb::none(), "dst_block_stride"_a.none() = nb::none(),
        "src_block_stride"_a.none() = nb::none(), "dst_layer_stride"_a.none() = nb::none(),
        "src_layer_stride"_a.none() = nb::none(), "stream"_a.none() = nb::none(), "strategy"_a.none() = nb::none(),
        "device"_a.none() = nb::none(), "wait"_a = true);
  m.def("engine", [](nb::handle device) -> cuda::CopyEngine& { return engine_for(int_arg<int>(device, "device", 0, kMaxDevices - 1)); },
        "device"_a.none() = 0, nb::rv_policy::reference,
        "The process's copy engine for `device` (made on first use).");
}

// The Engine class: addresses as ints (int_address), for benchmarks and
// private engines with their own machine profile.
void bind_engine_class(nb::module_& m) {
  nb::class_<cuda::CopyEngine>(m, "Engine")
      .def("__init__",
           [](cuda::CopyEngine* e, nb::handle device, nb::handle profile) {
             auto o = cuda::CopyEngineOptions::from_environment(int_arg<int>(device, "device", 0, INT32_MAX));
             // A private engine with its own machine profile (profile lines; keys
             // not named keep their defaults): benchmarks compare settings in one process.
             if (!profile.is_none()) o.profile = parse_profile(nb::cast<std::string>(profile));
             ferry::python::GilRelease unlocked;
             new (e) cuda::CopyEngine(o);
           },
           "device"_a.none() = 0, "profile"_a.none() = nb::none())
      .def("copy",
           [](cuda::CopyEngine& e, nb::handle dst, nb::handle src, nb::handle n, nb::handle stream,
               nb::handle strategy) {
             void *d = int_address(dst, "dst"), *s = int_address(src, "src");
             const size_t bytes = size_arg(n, "nbytes");
             const cudaStream_t st = int_stream(stream);
             Strategy how = strategy_of(strategy);
             ferry::python::GilRelease unlocked;
             e.copy(d, s, bytes, st, how);
           },
           "dst"_a.none(), "src"_a.none(), "nbytes"_a.none(), "stream"_a.none() = 0, "strategy"_a.none() = nb::none())
      .def("copy_async",
           [](cuda::CopyEngine& e, nb::handle dst, nb::handle src, nb::handle n, nb::handle stream,
               nb::handle strategy) {
             void *d = int_address(dst, "dst"), *s = int_address(src, "src");
             const size_t bytes = size_arg(n, "nbytes");
             const cudaStream_t st = int_stream(stream);
             Strategy how = strategy_of(strategy);
             ferry::python::GilRelease unlocked;
             return e.copy_async(d, s, bytes, st, how);
           },
           "dst"_a.none(), "src"_a.none(), "nbytes"_a.none(), "stream"_a.none() = 0, "strategy"_a.none() = nb::none())
      .def("copy_many_async",
           [](cuda::CopyEngine& e, nb::handle dsts, nb::handle srcs, nb::handle sizes, nb::handle stream,
               nb::handle strategy) {
             auto ops = int_ops(addresses(dsts, "dsts"), addresses(srcs, "srcs"), addresses(sizes, "sizes"));
             const cudaStream_t st = int_stream(stream);
             Strategy how = strategy_of(strategy);
             ferry::python::GilRelease unlocked;
             return e.copy_many_async(ops, st, how);
           },
           "dsts"_a.none(), "srcs"_a.none(), "sizes"_a.none(), "stream"_a.none() = 0, "strategy"_a.none() = nb::none())
      .def("plan",
           [](cuda::CopyEngine& e, nb::handle dst, nb::handle src, nb::handle n, nb::handle strategy) {
             return std::string(strategy_name(e.plan(int_address(dst, "dst"), int_address(src, "src"),
                                                     size_arg(n, "nbytes"), strategy_of(strategy))));
           },
           "dst"_a.none(), "src"_a.none(), "nbytes"_a.none(), "strategy"_a.none() = nb::none())
      .def("warm_up",
           [](cuda::CopyEngine& e) {
             ferry::python::GilRelease unlocked;
             e.warm_up();
           })
      .def("stats", &engine_stats)
      .def_prop_ro("device", [](const cuda::CopyEngine& e) { return e.options().device; });
}

// A fixed block list launched many times (cuda/copy/block_plan.h): the SM
// kernel's graph-capturable form. Addresses as copy_many takes them.
void bind_block_plan(nb::module_& m) {
  nb::class_<cuda::BlockPlan>(m, "BlockPlan")
      .def("__init__",
           [](cuda::BlockPlan* plan, nb::handle dsts, nb::handle srcs, nb::handle sizes, nb::handle device,
              nb::handle max_sms) {
             Prepared p = prepare_addresses(dsts, srcs, sizes, nb::none(), device);
             const int sms = max_sms.is_none() ? 0 : int_arg<int>(max_sms, "max_sms", 1, 1024);
             cuda::CopyEngine& e = engine_for(p.device);
             ferry::python::GilRelease unlocked;
             new (plan) cuda::BlockPlan(e, p.ops, sms);
           },
           "dsts"_a.none(), "srcs"_a.none(), "sizes"_a.none(), "device"_a.none() = nb::none(),
           "max_sms"_a.none() = nb::none())
      .def("launch",
           [](const cuda::BlockPlan& plan, nb::handle stream) {
             const cudaStream_t s = stream_of(stream, -1);
             ferry::python::GilRelease unlocked;
             plan.launch(s);
           },
           "stream"_a.none() = nb::none())
      .def_prop_ro("items", &cuda::BlockPlan::items)
      .def_prop_ro("pieces", &cuda::BlockPlan::pieces)
      .def_prop_ro("nbytes", &cuda::BlockPlan::bytes);
}

// Host memory pinned for a device (cuda/registration.h).
void bind_registration(nb::module_& m) {
  nb::class_<cuda::Registration>(m, "Registration")
      .def("__init__",
           [](cuda::Registration* r, nb::handle p, nb::handle n, nb::handle device) {
             void* base = ptr(int_arg<uintptr_t>(p, "ptr"));
             const size_t bytes = size_arg(n, "nbytes");
             const int dev = int_arg<int>(device, "device", 0, INT32_MAX);
             ferry::python::GilRelease unlocked;
             new (r) cuda::Registration(base, bytes, dev);
           },
           "ptr"_a.none(), "nbytes"_a.none(), "device"_a.none() = 0)
      .def_prop_ro("base", [](const cuda::Registration& r) { return reinterpret_cast<uintptr_t>(r.base()); })
      .def_prop_ro("registered_bytes", &cuda::Registration::registered_bytes);
}

}  // namespace

void bind_copy(nb::module_& m) {
  bind_copy_args(m);
  bind_completion(m);
  bind_copy_calls(m);
  bind_engine_class(m);
  bind_block_plan(m);
  bind_registration(m);
}

}  // namespace ferry::python
