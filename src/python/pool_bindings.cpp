// pool_bindings.cpp — ferry.Pool (a pool of host memory, pinned for a device
// or not: pool/pool.h, cuda/pinned_pool.h) and ferry.Buffer, one allocation of
// it.
//
// A Buffer implements the buffer protocol and __dlpack__; while any export is
// alive, release() refuses (BufferError) so no view ever points at recycled
// memory. Exports are counted under the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/options.h"
#include "cuda/pinned_pool.h"
#include "pool/pool.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/gil.h"
#include "python/handles.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {
namespace {

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
  ferry::PoolOptions o = ferry::PoolOptions::from_environment();
  for (auto [key, value] : d) {
    const std::string k = str_arg(key, "pool option name");
    if (value.is_none()) continue;
    const char* name = k.c_str();
    if (k == "chunk_bytes") o.chunk_bytes = size_arg(value, name);
    else if (k == "memfd") o.memfd = bool_arg(value, name);
    else if (k == "huge_pages") o.huge_pages = ferry::parse_huge_policy(str_arg(value, name));
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
    throw ferry::InvalidArgument("huge=" + arg_repr(h) + ": expected None, True or False");
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

void pool_init(PoolHandle* h, nb::dict options, bool pinned, nb::handle device_arg) {
  ferry::PoolOptions o = pool_options(options);
  const int device = int_arg<int>(device_arg, "device", 0, INT32_MAX);
  new (h) PoolHandle();
  GilRelease unlocked;
  if (pinned)
    h->pool = ferry::cuda::make_pinned_pool(o, device);
  else
    h->pool = std::make_shared<ferry::Pool>(o);
  h->pinned = pinned;
  h->device = pinned ? device : -1;
}

nb::object pool_alloc(PoolHandle& h, nb::handle nbytes, nb::handle alignment_arg, nb::handle huge,
                      nb::handle zero_arg) {
  const size_t bytes = size_arg(nbytes, "nbytes");
  const size_t alignment = size_arg(alignment_arg, "alignment");
  const bool zero = bool_arg(zero_arg, "zero");
  const ferry::HugeWant want = huge_want(huge);
  // From cached memory with the GIL held: no system call, no wait,
  // cheaper than releasing the GIL. Else (a new chunk to reserve,
  // touch and pin, the target to wait for, much to clear) without it.
  const bool clears = zero || h.pool->options().zero_recycled;
  void* p = !clears || bytes <= kClearWithGil ? h.pool->allocate_cached(bytes, alignment, want, zero) : nullptr;
  if (!p) {
    GilRelease unlocked;
    p = h.pool->allocate(bytes, alignment, want, zero);
  }
  return new_buffer(h, p, bytes);
}

void bind_buffer(nb::module_& m) {
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
}

void bind_pool_class(nb::module_& m) {
  nb::class_<PoolHandle>(m, "Pool")
      .def("__init__", &pool_init, "options"_a, "pinned"_a = false, "device"_a.none() = 0)
      .def("alloc", &pool_alloc, "nbytes"_a.none(), "alignment"_a.none() = 256, "huge"_a.none() = nb::none(),
           "zero"_a.none() = false)
      .def("trim",
           [](PoolHandle& h, nb::handle keep_arg) {
             const size_t keep = size_arg(keep_arg, "keep_bytes");
             GilRelease unlocked;
             return h.pool->trim(keep);
           },
           "keep_bytes"_a.none() = 0)
      .def("wait_ready",
           [](PoolHandle& h) {
             GilRelease unlocked;
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
             const size_t address = size_arg(address_arg, "address");
             const ferry::Pool::SharedLocation where =
                 h.pool->shared_location(reinterpret_cast<const void*>(address));
             if (where.fd < 0) return nb::none();
             return nb::make_tuple(where.fd, where.offset);
           },
           "address"_a.none())
      .def_prop_ro("chunk_generation", [](const PoolHandle& h) { return h.pool->chunk_generation(); })
      .def_prop_ro("pinned", [](const PoolHandle& h) { return h.pinned; })
      .def_prop_ro("device", [](const PoolHandle& h) { return h.device; });
}

}  // namespace

void bind_pool(nb::module_& m) {
  bind_buffer(m);
  bind_pool_class(m);
}

}  // namespace ferry::python
