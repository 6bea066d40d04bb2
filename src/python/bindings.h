// bindings.h — the parts of the extension `ferry._ferry`, one function per
// concept, each in its own file; module.cpp calls them in this order (the
// error translator first, Pool before the bindings that take a Pool).
#pragma once

#include <nanobind/nanobind.h>

namespace ferry::python {

void bind_errors(nanobind::module_& m);          // ferry::Error -> ferry.errors: error_bindings.cpp
void bind_options(nanobind::module_& m);         // FERRY_* options, fault injection: options_bindings.cpp
void bind_doctor(nanobind::module_& m);          // versions, devices, copy crew plan: doctor_bindings.cpp
void bind_pool(nanobind::module_& m);            // Pool and Buffer: pool_bindings.cpp
void bind_bench(nanobind::module_& m);           // timing loops of `ferry bench`: bench.cpp
void bind_pool_tensor(nanobind::module_& m);     // pool memory as DLPack tensors: pool_tensor.cpp
void bind_copy(nanobind::module_& m);            // copy engines, registrations: copy_bindings.cpp
void bind_channel(nanobind::module_& m);         // low-latency channel: channel_bindings.cpp
void bind_managed(nanobind::module_& m);         // PyTorch allocators: managed_bindings.cpp
void bind_load(nanobind::module_& m);            // checkpoint loader, safetensors: load_bindings.cpp
void bind_node(nanobind::module_& m);            // the node pool: node_bindings.cpp
void bind_handoff(nanobind::module_& m);         // the node handoff: handoff_bindings.cpp
void bind_node_file(nanobind::module_& m);       // the node load's file protocol: node_file_bindings.cpp
void bind_write_pipeline(nanobind::module_& m);  // load/write_pipeline.h: write_pipeline_bindings.cpp
void bind_os(nanobind::module_& m);              // src/os for python/ferry: os_bindings.cpp
void bind_sysfs(nanobind::module_& m);           // cpulist, THP setting parsers: sysfs_bindings.cpp

}  // namespace ferry::python
