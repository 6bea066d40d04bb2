// module.cpp — the nanobind extension `ferry._ferry`: thin bindings of the C++
// API, one bind_* function per concept (bindings.h names the file of each).
// Policy (Python defaults, friendly wrappers) lives in python/ferry/.
#include <nanobind/nanobind.h>

#include "python/bindings.h"
#include "python/gil.h"

namespace nb = nanobind;

NB_MODULE(_ferry, m) {
  m.doc() = "ferry's native core (use the `ferry` package, not this module)";

  // Exit with daemon threads inside ferry calls must not abort (python/gil.h).
  nb::module_::import_("atexit").attr("register")(nb::cpp_function(&ferry::python::wait_for_calls_at_exit));
  // Daemon threads still hold pools and buffers when the interpreter ends;
  // nanobind would report those as reference leaks of the bindings.
  nb::set_leak_warnings(false);

  ferry::python::bind_errors(m);   // ferry::Error -> its ferry.errors class
  ferry::python::bind_options(m);  // FERRY_* options, fault injection
  ferry::python::bind_doctor(m);   // versions, devices, the copy engine's plans
  ferry::python::bind_pool(m);     // Pool, Buffer
  ferry::python::bind_bench(m);
  ferry::python::bind_pool_tensor(m);
  ferry::python::bind_copy(m);
  ferry::python::bind_channel(m);         // low-latency channel
  ferry::python::bind_managed(m);         // PyTorch allocators
  ferry::python::bind_load(m);            // checkpoint loader
  ferry::python::bind_node(m);            // node pool
  ferry::python::bind_handoff(m);         // node handoff
  ferry::python::bind_node_file(m);       // node load's shared file reads
  ferry::python::bind_write_pipeline(m);  // save's writers
  ferry::python::bind_os(m);              // the OS layer python/ferry uses
  ferry::python::bind_sysfs(m);           // the cpulist and THP parsers facts/ uses
}
