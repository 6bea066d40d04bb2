// capi_core.cpp — C API: status names, versions, options, fault injection, devices.
#include <cstring>

#include "capi/guard.h"
#include "capi/struct_size.h"
#include "core/fault.h"
#include "core/options.h"
#include "cuda/device.h"

using ferry::capi::guarded;
using ferry::capi::require;

extern "C" {

const char* ferry_status_name(ferry_status_t status) {
  switch (status) {
    case FERRY_SUCCESS: return "FERRY_SUCCESS";
    case FERRY_ERROR_INVALID_ARGUMENT: return "FERRY_ERROR_INVALID_ARGUMENT";
    case FERRY_ERROR_OUT_OF_MEMORY: return "FERRY_ERROR_OUT_OF_MEMORY";
    case FERRY_ERROR_OS: return "FERRY_ERROR_OS";
    case FERRY_ERROR_CUDA: return "FERRY_ERROR_CUDA";
    case FERRY_ERROR_NO_DEVICE: return "FERRY_ERROR_NO_DEVICE";
    case FERRY_ERROR_NOT_SUPPORTED: return "FERRY_ERROR_NOT_SUPPORTED";
    case FERRY_ERROR_INTERNAL: return "FERRY_ERROR_INTERNAL";
    case FERRY_ERROR_TIMEOUT: return "FERRY_ERROR_TIMEOUT";
    case FERRY_ERROR_PEER_GONE: return "FERRY_ERROR_PEER_GONE";
    case FERRY_ERROR_BROKEN: return "FERRY_ERROR_BROKEN";
  }
  return "FERRY_ERROR_UNKNOWN";
}

ferry_status_t ferry_get_api_version(int* major, int* minor) {
  return guarded([&] {
    require(major, "major");
    require(minor, "minor");
    *major = FERRY_API_MAJOR;
    *minor = FERRY_API_MINOR;
  });
}

ferry_status_t ferry_get_versions(ferry_versions_t* out) {
  return guarded([&] {
    require(out, "out");
    ferry::capi::caller_struct_size(out, "out");  // before the work
    ferry_versions_t c{};
    c.api_major = FERRY_API_MAJOR;
    c.api_minor = FERRY_API_MINOR;
    std::strncpy(c.library, FERRY_VERSION_STRING, sizeof c.library - 1);
    ferry::cuda::Versions v = ferry::cuda::versions();
    c.cuda_runtime = v.runtime;
    c.cuda_driver = v.driver;
    ferry::capi::write_struct(out, c, "out");
  });
}

ferry_status_t ferry_options_check(void) {
  return guarded([] { ferry::options(); });
}

ferry_status_t ferry_option_count(size_t* count) {
  return guarded([&] {
    require(count, "count");
    *count = ferry::option_table().size();
  });
}

ferry_status_t ferry_option_info(size_t index, const char** name, const char** default_value,
                                 const char** doc) {
  return guarded([&] {
    auto table = ferry::option_table();
    if (index >= table.size())
      throw ferry::InvalidArgument("option index " + std::to_string(index) + " out of range (" +
                                   std::to_string(table.size()) + " options)");
    if (name) *name = table[index].name;
    if (default_value) *default_value = table[index].default_value;
    if (doc) *doc = table[index].doc;
  });
}

ferry_status_t ferry_set_fault_injection(const char* spec) {
  return guarded([&] { ferry::set_fault_injection(spec ? spec : ""); });
}

ferry_status_t ferry_device_count(int* count) {
  return guarded([&] {
    require(count, "count");
    *count = ferry::cuda::device_count();
  });
}

}  // extern "C"
