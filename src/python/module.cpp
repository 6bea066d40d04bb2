// module.cpp — the nanobind extension `ferry._ferry`: thin bindings of the C++
// API. Policy (Python defaults, friendly wrappers) lives in python/ferry/.
//
// Errors: ferry::Error becomes the ferry.errors class of its status (FerryError
// subclasses that also derive from MemoryError, ValueError, ...).
// Buffers: a Buffer is one pool allocation. It implements the buffer protocol
// and __dlpack__; while any export is alive, release() refuses (BufferError)
// so no view ever points at recycled memory.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <typeinfo>

#include "core/error.h"
#include "core/fault.h"
#include "core/options.h"
#include "copy/copy_crew.h"
#include "copy/profile_file.h"
#include "cuda/device.h"
#include "cuda/pinned_pool.h"
#include "os/file.h"
#include "pool/pool.h"
#include "python/args.h"
#include "python/handles.h"
#include "python/gil.h"

namespace ferry::python {
void bind_bench(nanobind::module_& m);
void bind_pool_tensor(nanobind::module_& m);  // pool memory as DLPack tensors: pool_tensor.cpp
void bind_copy(nanobind::module_& m);
void bind_channel(nanobind::module_& m);  // low-latency channel: channel_bindings.cpp
void bind_managed(nanobind::module_& m);  // PyTorch allocators: managed_bindings.cpp
void bind_load(nanobind::module_& m);     // checkpoint loader, safetensors: load_bindings.cpp
void bind_node(nanobind::module_& m);     // the node pool: node_bindings.cpp
void bind_handoff(nanobind::module_& m);  // the node handoff: handoff_bindings.cpp
void bind_write_pipeline(nanobind::module_& m);  // load/write_pipeline.h: write_pipeline_bindings.cpp
void bind_os(nanobind::module_& m);  // src/os for python/ferry (files, mappings, sockets, /proc): os_bindings.cpp
}

namespace nb = nanobind;
using namespace nb::literals;

namespace {

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

// ---- pools and buffers ----------------------------------------------------

using ferry::python::PoolHandle;

struct Buffer {
  std::shared_ptr<ferry::Pool> pool;  // keeps the pool alive while the buffer is
  void* ptr = nullptr;
  size_t size = 0;
  bool pinned = false;
  long exports = 0;  // live buffer-protocol views and DLPack tensors (GIL-guarded)

  void release() {
    if (!ptr) return;
    if (exports > 0)
      throw nb::buffer_error(("cannot release a ferry buffer while " + std::to_string(exports) +
                              " view(s) or tensor(s) of it are alive")
                                 .c_str());
    void* p = ptr;
    ptr = nullptr;
    pool->deallocate(p);
    pool.reset();
  }
  ~Buffer() {
    if (ptr && pool) pool->deallocate(ptr);  // exports hold a reference, so none is alive here
  }
  void* checked() const {
    if (!ptr) throw nb::value_error("this ferry buffer was released");
    return ptr;
  }
};

// Most bytes a Python allocation clears while it holds the GIL.
constexpr size_t kClearWithGil = size_t{1} << 20;

// A Buffer built inside its Python object (no separate heap object); frees
// `p` if that fails.
nb::object new_buffer(PoolHandle& h, void* p, size_t size) {
  nb::object o;
  try {
    o = nb::inst_alloc(nb::type<Buffer>());
  } catch (...) {
    h.pool->deallocate(p);
    throw;
  }
  new (nb::inst_ptr<Buffer>(o)) Buffer{h.pool, p, size, h.pinned, 0};
  nb::inst_mark_ready(o);
  return o;
}

int buffer_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  Buffer* b = nb::inst_ptr<Buffer>(self);
  if (!b->ptr) {
    PyErr_SetString(PyExc_BufferError, "this ferry buffer was released");
    view->obj = nullptr;
    return -1;
  }
  if (PyBuffer_FillInfo(view, self, b->ptr, static_cast<Py_ssize_t>(b->size), 0, flags) < 0)
    return -1;
  ++b->exports;
  return 0;
}

void buffer_releasebuffer(PyObject* self, Py_buffer*) { --nb::inst_ptr<Buffer>(self)->exports; }

PyType_Slot buffer_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(buffer_getbuffer)},
                              {Py_bf_releasebuffer, reinterpret_cast<void*>(buffer_releasebuffer)},
                              {0, nullptr}};

// A DLPack export holds the Buffer object and counts as an export until the
// consumer drops it.
struct ExportToken {
  PyObject* buffer;
};

nb::object buffer_dlpack(nb::handle self, nb::kwargs kwargs) {
  Buffer* b = nb::inst_ptr<Buffer>(self);
  void* data = b->checked();
  auto* token = new ExportToken{self.ptr()};
  Py_INCREF(self.ptr());
  ++b->exports;
  nb::capsule owner(token, [](void* p) noexcept {
    auto* t = static_cast<ExportToken*>(p);
    --nb::inst_ptr<Buffer>(t->buffer)->exports;
    Py_DECREF(t->buffer);
    delete t;
  });
  size_t shape[1] = {b->size};
  nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig> arr(data, 1, shape, owner);
  (void)kwargs;  // stream / max_version / dl_device / copy: a CPU buffer needs none
  return nb::cast(arr);  // an unversioned "dltensor" capsule
}

ferry::PoolOptions pool_options(const nb::dict& d) {
  using ferry::python::bool_arg;
  using ferry::python::int_arg;
  using ferry::python::size_arg;
  ferry::PoolOptions o = ferry::PoolOptions::from_environment();
  for (auto [key, value] : d) {
    const std::string k = ferry::python::str_arg(key, "pool option name");
    if (value.is_none()) continue;
    const char* name = k.c_str();
    if (k == "chunk_bytes") o.chunk_bytes = size_arg(value, name);
    else if (k == "memfd") o.memfd = bool_arg(value, name);
    else if (k == "huge_pages") o.huge_pages = ferry::parse_huge_policy(ferry::python::str_arg(value, name));
    else if (k == "limit_bytes") o.limit_bytes = size_arg(value, name);
    else if (k == "zero_recycled") o.zero_recycled = bool_arg(value, name);
    else if (k == "touch_threads") o.touch_threads = int_arg<int>(value, name, 0, ferry::kMaxThreads);
    else if (k == "release_delay_ms")
      o.release_delay_ms = int_arg<int64_t>(value, name, 0, ferry::kMaxReleaseDelayMs);
    else if (k == "release_batch_bytes") o.release_batch_bytes = size_arg(value, name);
    else if (k == "numa_node") o.numa_node = int_arg<int>(value, name, -2, ferry::kMaxNumaNode);
    else if (k == "target_bytes") o.target_bytes = size_arg(value, name);
    else if (k == "target_huge")
      o.target_kind = bool_arg(value, name) ? ferry::HugeWant::yes : ferry::HugeWant::no;
    else if (k == "register_lead_bytes") o.register_lead_bytes = size_arg(value, name);
    else throw ferry::InvalidArgument("unknown pool option '" + k + "'");
  }
  o.validate();  // ranges, named and quoted, before any thread starts
  return o;
}

ferry::HugeWant huge_want(nb::handle h) {
  if (h.is_none()) return ferry::HugeWant::automatic;
  if (!PyBool_Check(h.ptr()))
    throw ferry::InvalidArgument("huge=" + ferry::python::arg_repr(h) + ": expected None, True or False");
  return h.ptr() == Py_True ? ferry::HugeWant::yes : ferry::HugeWant::no;
}

nb::dict counter_dict(const ferry::Counter& c) {
  nb::dict d;
  d["current"] = c.current;
  d["peak"] = c.peak;
  d["total"] = c.total;
  return d;
}

nb::dict stats_dict(const ferry::PoolStats& s) {
  nb::dict out;
  const char* kinds[2] = {"small", "huge"};
  for (int k = 0; k < 2; ++k) {
    nb::dict kd;
    kd["reserved"] = counter_dict(s.kind[k].reserved);
    kd["committed"] = counter_dict(s.kind[k].committed);
    kd["in_use"] = counter_dict(s.kind[k].in_use);
    kd["cached"] = counter_dict(s.kind[k].cached);
    kd["released"] = counter_dict(s.kind[k].released);
    out[kinds[k]] = kd;
  }
  out["allocations"] = s.allocations;
  out["frees"] = s.frees;
  out["recycles"] = s.recycles;
  out["chunk_reservations"] = s.chunk_reservations;
  out["chunk_releases"] = s.chunk_releases;
  out["fallbacks"] = s.fallbacks;
  out["touch_seconds"] = s.touch_ns / 1e9;
  out["register_seconds"] = s.register_ns / 1e9;
  out["target_seconds"] = s.target_ns / 1e9;
  out["zeroed_bytes"] = s.zeroed_bytes;
  out["zero_seconds"] = s.zero_ns / 1e9;
  nb::dict chunks;
  const ferry::Backing backings[] = {ferry::Backing::small_pages, ferry::Backing::thp,
                                     ferry::Backing::hugetlb_2m, ferry::Backing::hugetlb_1g};
  for (int i = 0; i < 4; ++i) chunks[ferry::backing_name(backings[i])] = s.chunks_by_backing[i];
  out["chunks"] = chunks;
  out["notes"] = s.notes;
  return out;
}

// ---- devices ----------------------------------------------------------------

nb::object cuda_info() {
  ferry::cuda::Versions v = ferry::cuda::versions();
  if (v.driver == 0) return nb::none();
  nb::dict info;
  info["driver_version"] = v.driver;
  info["runtime_version"] = v.runtime;
  nb::list devices;
  int n = 0;
  try {
    n = ferry::cuda::device_count();
  } catch (const ferry::NoDevice& e) {
    info["error"] = std::string(e.what());
  }
  for (int i = 0; i < n; ++i) {
    ferry::cuda::DeviceInfo d = ferry::cuda::device_info(i);
    nb::dict dd;
    dd["index"] = d.index;
    dd["name"] = d.name;
    dd["total_memory_bytes"] = d.total_memory_bytes;
    dd["pci_bus_id"] = d.pci_bus_id;
    dd["compute_capability"] = std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor);
    dd["multiprocessors"] = d.multiprocessors;
    dd["async_engine_count"] = d.async_engine_count;
    dd["host_native_atomic_supported"] = d.host_native_atomic_supported;
    dd["pageable_memory_access"] = d.pageable_memory_access;
    dd["concurrent_managed_access"] = d.concurrent_managed_access;
    dd["can_map_host_memory"] = d.can_map_host_memory;
    dd["host_register_supported"] = d.host_register_supported;
    dd["numa_node"] = d.numa_node;
    devices.append(dd);
  }
  info["devices"] = devices;
  return info;
}

}  // namespace

NB_MODULE(_ferry, m) {
  m.doc() = "ferry's native core (use the `ferry` package, not this module)";

  // Exit with daemon threads inside ferry calls must not abort (python/gil.h).
  nb::module_::import_("atexit").attr("register")(nb::cpp_function(&ferry::python::wait_for_calls_at_exit));
  // Daemon threads still hold pools and buffers when the interpreter ends;
  // nanobind would report those as reference leaks of the bindings.
  nb::set_leak_warnings(false);

  // ferry::Error -> its ferry.errors class. A message may hold bytes that are
  // not UTF-8 (a file name as the OS spelled it): they appear as \xNN escapes,
  // never as a UnicodeDecodeError in place of the error.
  // The last resort for a conversion that no checked argument (args.h) caught:
  // nanobind's std::bad_cast (a cast_error) becomes InvalidArgumentError, not
  // "RuntimeError: std::bad_cast".
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    // errno >= 0: OSLayerError(errno, text), an OSError whose .errno callers test
    auto raise = [](const char* cls_name, const std::string& text, int err = -1) {
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
    };
    try {
      std::rethrow_exception(p);
    } catch (const ferry::OsError& e) {
      raise("OSLayerError", e.what(), e.error_number());
    } catch (const ferry::Error& e) {
      raise(error_class(e.status()), e.what());
    } catch (const std::bad_cast&) {
      raise("InvalidArgumentError", "an argument has the wrong type (see the function's documentation)");
    }
  });

  // O_DIRECT's alignment, one fact for the C++ loader and Python's writers.
  m.attr("DIRECT_IO_ALIGNMENT") = ferry::os::kDirectIoAlignment;
  m.def("versions", [] {
    ferry::cuda::Versions v = ferry::cuda::versions();
    nb::dict d;
    d["library"] = FERRY_VERSION_STRING;
    d["api"] = std::to_string(FERRY_API_MAJOR) + "." + std::to_string(FERRY_API_MINOR);
    d["cuda_runtime"] = v.runtime;
    d["cuda_driver"] = v.driver;
    return d;
  });
  m.def("option_table", [] {
    nb::list rows;
    for (const auto& s : ferry::option_table())
      rows.append(nb::make_tuple(s.name, s.default_value, s.doc));
    return rows;
  });
  m.def("option_text", [](const std::string& name) { return ferry::options().text(name.c_str()); }, "name"_a,
        "The value of a choice or text FERRY_* option, as this process read it (once, at first use).");
  m.def("check_options", [] { ferry::options(); },
        "Raise InvalidArgumentError if a FERRY_* variable is unknown or has a bad value.");
  // The copy engine's decisions, asked without CUDA (`ferry doctor`: python/ferry/facts/copy_engine.py).
  m.def("plan_copy_crew",
        [](nb::handle numa_node) {
          const ferry::CrewPlan plan = ferry::plan_copy_crew(ferry::python::int_arg<int>(numa_node, "numa_node"));
          nb::dict d;
          d["threads"] = plan.threads;
          d["numa_node"] = plan.numa_node < 0 ? nb::object(nb::none()) : nb::cast(plan.numa_node);
          d["cpus"] = plan.cpus;
          d["workers"] = plan.workers;
          d["spin_us"] = plan.spin_us;
          return d;
        },
        "numa_node"_a = -1,
        "The crew of copy threads the engine of a GPU on `numa_node` uses (negative: none known), planned "
        "without starting it: {threads (counting the caller), numa_node (None: the default crew), cpus "
        "(empty: not bound), workers (FERRY_COPY_WORKERS; 0: one per usable core), spin_us}. "
        "InvalidArgumentError for bad FERRY_* options.");
  m.def("profile_file_path",
        [] {
          bool named = false;
          const std::string path = ferry::profile_file_path(&named);
          if (path.empty()) return nb::make_tuple(nb::none(), named);
          // Decoded as os.environ decodes the variables it came from (surrogateescape).
          PyObject* text = PyUnicode_DecodeFSDefaultAndSize(path.data(), static_cast<Py_ssize_t>(path.size()));
          if (!text) throw nb::python_error();
          return nb::make_tuple(nb::steal(text), named);
        },
        "(path or None, named): the machine profile file the copy engine reads, and whether FERRY_PROFILE "
        "named it. InvalidArgumentError for bad FERRY_* options.");
  m.def("set_fault_injection",
        [](nb::handle spec) { ferry::set_fault_injection(ferry::python::str_arg(spec, "spec")); }, "spec"_a.none());
  m.def("cuda_info", &cuda_info,
        "CUDA driver/runtime versions and device properties; None without a driver.");
  m.def("device_count", [] { return ferry::cuda::device_count(); });

  nb::class_<Buffer>(m, "Buffer", nb::type_slots(buffer_slots))
      .def_prop_ro("ptr", [](const Buffer& b) { return reinterpret_cast<uintptr_t>(b.checked()); })
      .def_prop_ro("nbytes", [](const Buffer& b) { return b.size; })
      .def_prop_ro("pinned", [](const Buffer& b) { return b.pinned; })
      .def_prop_ro("released", [](const Buffer& b) { return b.ptr == nullptr; })
      .def_prop_ro("exports", [](const Buffer& b) { return b.exports; })
      .def("release", &Buffer::release,
           "Return the memory to its pool now (BufferError while views of it are alive).")
      .def("__len__", [](const Buffer& b) { return b.size; })
      .def("__dlpack__", &buffer_dlpack)
      .def("__dlpack_device__", [](const Buffer&) { return nb::make_tuple(1, 0); });  // kDLCPU

  nb::class_<PoolHandle>(m, "Pool")
      .def("__init__",
           [](PoolHandle* h, nb::dict options, bool pinned, nb::handle device_arg) {
             ferry::PoolOptions o = pool_options(options);
             const int device = ferry::python::int_arg<int>(device_arg, "device", 0, INT32_MAX);
             new (h) PoolHandle();
             ferry::python::GilRelease unlocked;
             if (pinned)
               h->pool = ferry::cuda::make_pinned_pool(o, device);
             else
               h->pool = std::make_shared<ferry::Pool>(o);
             h->pinned = pinned;
             h->device = pinned ? device : -1;
           },
           "options"_a, "pinned"_a = false, "device"_a.none() = 0)
      .def("alloc",
           [](PoolHandle& h, nb::handle nbytes, nb::handle alignment_arg, nb::handle huge, nb::handle zero_arg) {
             const size_t bytes = ferry::python::size_arg(nbytes, "nbytes");
             const size_t alignment = ferry::python::size_arg(alignment_arg, "alignment");
             const bool zero = ferry::python::bool_arg(zero_arg, "zero");
             const ferry::HugeWant want = huge_want(huge);
             // From cached memory with the GIL held: no system call, no wait,
             // cheaper than releasing the GIL. Else (a new chunk to reserve,
             // touch and pin, the target to wait for, much to clear) without it.
             const bool clears = zero || h.pool->options().zero_recycled;
             void* p = !clears || bytes <= kClearWithGil ? h.pool->allocate_cached(bytes, alignment, want, zero)
                                                         : nullptr;
             if (!p) {
               ferry::python::GilRelease unlocked;
               p = h.pool->allocate(bytes, alignment, want, zero);
             }
             return new_buffer(h, p, bytes);
           },
           "nbytes"_a.none(), "alignment"_a.none() = 256, "huge"_a.none() = nb::none(), "zero"_a.none() = false)
      .def("trim",
           [](PoolHandle& h, nb::handle keep_arg) {
             const size_t keep = ferry::python::size_arg(keep_arg, "keep_bytes");
             ferry::python::GilRelease unlocked;
             return h.pool->trim(keep);
           },
           "keep_bytes"_a.none() = 0)
      .def("wait_ready",
           [](PoolHandle& h) {
             ferry::python::GilRelease unlocked;
             h.pool->wait_ready();
           })
      .def("stats",
           [](PoolHandle& h) {
             nb::dict d = stats_dict(h.pool->stats());
             d["zero_recycled"] = h.pool->options().zero_recycled;
             return d;
           })
      .def("chunks",
           [](PoolHandle& h) {
             nb::list out;  // Pool::chunks() copies under the pool's lock; Python objects are made after
             for (const ferry::Pool::ChunkView& c : h.pool->chunks())
               out.append(nb::make_tuple(c.base, c.bytes, c.generation));
             return out;
           })
      .def("shared_location",
           [](PoolHandle& h, nb::handle address_arg) -> nb::object {
             const size_t address = ferry::python::size_arg(address_arg, "address");
             const ferry::Pool::SharedLocation where =
                 h.pool->shared_location(reinterpret_cast<const void*>(address));
             if (where.fd < 0) return nb::none();
             return nb::make_tuple(where.fd, where.offset);
           },
           "address"_a.none())
      .def_prop_ro("chunk_generation", [](const PoolHandle& h) { return h.pool->chunk_generation(); })
      .def_prop_ro("pinned", [](const PoolHandle& h) { return h.pinned; })
      .def_prop_ro("device", [](const PoolHandle& h) { return h.device; });

  ferry::python::bind_bench(m);
  ferry::python::bind_pool_tensor(m);
  ferry::python::bind_copy(m);
  ferry::python::bind_channel(m);  // low-latency channel
  ferry::python::bind_managed(m);  // PyTorch allocators
  ferry::python::bind_load(m);     // checkpoint loader
  ferry::python::bind_node(m);     // node pool
  ferry::python::bind_handoff(m);  // node handoff
  ferry::python::bind_write_pipeline(m);  // save's writers
  ferry::python::bind_os(m);              // the OS layer python/ferry uses
}
