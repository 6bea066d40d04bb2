// doctor_bindings.cpp — what `ferry doctor` and the version queries ask of the
// native core: library, API and CUDA versions, the devices and their
// properties, and the copy engine's decisions (its crew of threads, its
// machine profile file) asked without starting an engine.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "core/error.h"
#include "copy/copy_crew.h"
#include "copy/profile_file.h"
#include "cuda/device.h"
#include "python/args.h"
#include "python/bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {
namespace {

nb::dict versions_dict() {
  ferry::cuda::Versions v = ferry::cuda::versions();
  nb::dict d;
  d["library"] = FERRY_VERSION_STRING;
  d["api"] = std::to_string(FERRY_API_MAJOR) + "." + std::to_string(FERRY_API_MINOR);
  d["cuda_runtime"] = v.runtime;
  d["cuda_driver"] = v.driver;
  return d;
}

nb::dict device_dict(const ferry::cuda::DeviceInfo& d) {
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
  return dd;
}

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
  for (int i = 0; i < n; ++i) devices.append(device_dict(ferry::cuda::device_info(i)));
  info["devices"] = devices;
  return info;
}

nb::dict copy_crew_dict(nb::handle numa_node) {
  const ferry::CrewPlan plan = ferry::plan_copy_crew(int_arg<int>(numa_node, "numa_node"));
  nb::dict d;
  d["threads"] = plan.threads;
  d["numa_node"] = plan.numa_node < 0 ? nb::object(nb::none()) : nb::cast(plan.numa_node);
  d["cpus"] = plan.cpus;
  d["workers"] = plan.workers;
  d["spin_us"] = plan.spin_us;
  return d;
}

nb::tuple profile_file() {
  bool named = false;
  const std::string path = ferry::profile_file_path(&named);
  if (path.empty()) return nb::make_tuple(nb::none(), named);
  // Decoded as os.environ decodes the variables it came from (surrogateescape).
  PyObject* text = PyUnicode_DecodeFSDefaultAndSize(path.data(), static_cast<Py_ssize_t>(path.size()));
  if (!text) throw nb::python_error();
  return nb::make_tuple(nb::steal(text), named);
}

}  // namespace

void bind_doctor(nb::module_& m) {
  m.def("versions", &versions_dict);
  m.def("cuda_info", &cuda_info, "CUDA driver/runtime versions and device properties; None without a driver.");
  m.def("device_count", [] { return ferry::cuda::device_count(); });
  // The copy engine's decisions, asked without CUDA (`ferry doctor`: python/ferry/facts/copy_engine.py).
  m.def("plan_copy_crew", &copy_crew_dict, "numa_node"_a = -1,
        "The crew of copy threads the engine of a GPU on `numa_node` uses (negative: none known), planned "
        "without starting it: {threads (counting the caller), numa_node (None: the default crew), cpus "
        "(empty: not bound), workers (FERRY_COPY_WORKERS; 0: one per usable core), spin_us}. "
        "InvalidArgumentError for bad FERRY_* options.");
  m.def("profile_file_path", &profile_file,
        "(path or None, named): the machine profile file the copy engine reads, and whether FERRY_PROFILE "
        "named it. InvalidArgumentError for bad FERRY_* options.");
}

}  // namespace ferry::python
