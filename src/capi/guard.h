// guard.h — the C API's one way of turning C++ exceptions into a status code
// plus the thread-local message of ferry_last_error(). Nothing escapes it.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "core/error.h"
#include "ferry/ferry.h"

namespace ferry::capi {

void set_last_error(const std::string& message) noexcept;

ferry_status_t fail(ferry_status_t status, const std::string& message) noexcept;

template <class F>
ferry_status_t guarded(F&& body) noexcept {
  try {
    body();
    return FERRY_SUCCESS;
  } catch (const Error& e) {
    return fail(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return fail(FERRY_ERROR_OUT_OF_MEMORY, "out of host memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    return fail(FERRY_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(FERRY_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

// InvalidArgument naming a NULL output or handle argument.
void require(const void* p, const char* what);

}  // namespace ferry::capi
