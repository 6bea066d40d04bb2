// guard.cpp — the thread-local last-error message.
#include "capi/guard.h"

#include <cstring>

namespace ferry::capi {
thread_local std::string t_last_error;  // ferry_last_error()'s text

void set_last_error(const std::string& message) noexcept {
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();
  }
}

ferry_status_t fail(ferry_status_t status, const std::string& message) noexcept {
  set_last_error(message);
  return status;
}

void require(const void* p, const char* what) {
  if (!p) throw InvalidArgument(std::string(what) + " must not be NULL");
}

}  // namespace ferry::capi

extern "C" const char* ferry_last_error(void) { return ferry::capi::t_last_error.c_str(); }
