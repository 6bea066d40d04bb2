// managed_bindings.cpp — ferry._ferry's side of the PyTorch allocators: their
// configuration, stats and trim, and the path of libferry.so (whose extern "C"
// entry points PyTorch loads). Policy lives in python/ferry/torch/allocators.py.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "core/error.h"
#include "cuda/managed/managed_allocator.h"
#include "managed/managed_options.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {

void bind_managed(nb::module_& m) {
  m.def("managed_allocators", [] {
    nb::list names;
    for (ManagedKind k : {ManagedKind::device, ManagedKind::managed, ManagedKind::managed_pool})
      names.append(managed_kind_name(k));
    return names;
  });
  m.def("managed_configure",
        [](const std::string& name, const std::string& options) {
          cuda::managed_configure(parse_managed_kind(name), options);
        },
        "name"_a, "options"_a = "",
        "Set an allocator's options ('key=value,...'); InvalidArgumentError quoting a bad one.");
  m.def("managed_options",
        [](const std::string& name) { return cuda::managed_options_text(parse_managed_kind(name)); },
        "name"_a);
  m.def("managed_stats",
        [](const std::string& name, int device) {
          const ManagedKind kind = parse_managed_kind(name);
          cuda::ManagedStats s = cuda::managed_stats(kind, device);
          nb::dict d;
          d["allocator"] = name;
          d["allocated"] = s.allocated;
          d["allocated_peak"] = s.allocated_peak;
          d["requested"] = s.requested;
          d["reserved"] = s.reserved;
          d["reserved_peak"] = s.reserved_peak;
          d["allocations"] = s.allocations;
          d["frees"] = s.frees;
          d["failures"] = s.failures;
          d["prefetched_bytes"] = s.prefetched_bytes;
          d["prefetches"] = s.prefetches;
          d["chunks"] = s.chunks;
          d["reuse_same_stream"] = s.reuse_same_stream;
          d["reuse_after_fence"] = s.reuse_after_fence;
          d["reuse_by_wait"] = s.reuse_by_wait;
          d["last_failure"] = cuda::managed_last_failure(kind);
          d["options"] = cuda::managed_options_text(kind);
          return d;
        },
        "name"_a, "device"_a = -1);
  m.def("managed_trim",
        [](const std::string& name, int device) {
          const ManagedKind kind = parse_managed_kind(name);
          ferry::python::GilRelease unlocked;
          return cuda::managed_trim(kind, device);
        },
        "name"_a, "device"_a = -1);
  m.def("library_path", [] { return cuda::library_path(); },
        "The file libferry.so was loaded from ('' if unknown).");
}

}  // namespace ferry::python
