// guard.h — the C API's one way of turning C++ exceptions into a status code
// plus the thread-local message of ferry_last_error(). Nothing escapes it.
//
// Handles: every handle struct (ferry_pool, ferry_engine, ...) derives from
// Handle, whose first field is a magic number naming its kind while it lives
// and kDestroyedMagic after its destroy call. live() checks it on every call
// (one atomic load: nothing on the hot path), so a call on a destroyed handle
// or on a handle of another kind is InvalidArgument, not a crash. destroy()
// retires the magic atomically (of two destroys, one wins and the other is an
// error), releases what the handle owns, and keeps the empty shell in a FIFO
// quarantine of kQuarantine shells before freeing it, so that a late call
// still reads a dead magic. ferry.h says what stays undefined: a pointer that
// never was a handle, a handle destroyed more than kQuarantine destroys ago,
// and destroying a handle while another thread uses it.
#pragma once

#include <atomic>
#include <cstdint>
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

// Magic numbers of the handle kinds ("FPOL", "FENG", ...) and of a destroyed one.
constexpr uint32_t kPoolMagic = 0x46504F4Cu, kEngineMagic = 0x46454E47u, kCopyMagic = 0x46435059u,
                   kRegistrationMagic = 0x46524547u, kChannelMagic = 0x4643484Eu, kLoaderMagic = 0x464C4F44u,
                   kNodePoolMagic = 0x464E4F44u, kHandoffMagic = 0x46484F46u;
constexpr uint32_t kDestroyedMagic = 0xDEADF00Du;
constexpr size_t kQuarantine = 4096;

// "ferry_pool_t" for kPoolMagic, ...; nullptr for anything else.
const char* handle_type_name(uint32_t magic) noexcept;

class Handle {
 public:
  explicit Handle(uint32_t magic) noexcept : magic_(magic) {}
  virtual ~Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  uint32_t magic() const noexcept { return magic_.load(std::memory_order_acquire); }
  // True for the one caller that turns a live magic into kDestroyedMagic.
  bool retire(uint32_t live_magic) noexcept {
    return magic_.compare_exchange_strong(live_magic, kDestroyedMagic, std::memory_order_acq_rel);
  }

 private:
  std::atomic<uint32_t> magic_;
};

// The base of the handle struct of one kind: struct ferry_pool : HandleOf<kPoolMagic>.
template <uint32_t Magic>
struct HandleOf : Handle {
  static constexpr uint32_t kMagic = Magic;
  HandleOf() noexcept : Handle(Magic) {}
};

// "pool 0x5581... was destroyed: ..." / "is a ferry_engine_t, not a ferry_pool_t" /
// "is not a ferry_pool_t (...)".
std::string handle_problem(const void* h, uint32_t found, uint32_t expected, const char* what);

// Takes ownership of a retired shell; frees the oldest beyond kQuarantine.
void quarantine(Handle* h) noexcept;

// The handle `h` of kind H (a HandleOf): InvalidArgument for NULL, destroyed
// or of another kind.
template <class H>
H& live(H* h, const char* what) {
  require(h, what);
  const uint32_t found = h->magic();
  if (found != H::kMagic) throw InvalidArgument(handle_problem(h, found, H::kMagic, what));
  return *h;
}

// Retires `h`, calls release(*h) to free what it owns, quarantines the shell.
// An error of release() is reported after the handle is gone.
template <class H, class F>
void destroy(H* h, const char* what, F&& release) {
  require(h, what);
  if (!h->retire(H::kMagic)) throw InvalidArgument(handle_problem(h, h->magic(), H::kMagic, what));
  try {
    release(*h);
  } catch (...) {
    quarantine(h);
    throw;
  }
  quarantine(h);
}

}  // namespace ferry::capi
