// guard.cpp — the thread-local last-error message and the handle quarantine.
#include "capi/guard.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>

#include "core/fork.h"

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

namespace {

struct KnownKind {
  uint32_t magic;
  const char* type_name;
};
constexpr KnownKind kKinds[] = {{kPoolMagic, "ferry_pool_t"},
                                {kEngineMagic, "ferry_engine_t"},
                                {kCopyMagic, "ferry_copy_t"},
                                {kRegistrationMagic, "ferry_registration_t"},
                                {kChannelMagic, "ferry_channel_t"},
                                {kLoaderMagic, "ferry_loader_t"},
                                {kNodePoolMagic, "ferry_node_pool_t"},
                                {kHandoffMagic, "ferry_handoff_t"}};

struct Quarantine {
  std::mutex mu;
  std::deque<std::unique_ptr<Handle>> shells;  // guarded by mu, oldest first
};

Quarantine& quarantined() {
  static Quarantine q;
  return q;
}

// A forked child may destroy handles: the lock is held across fork(),
// registered at load (fork.h says why not on first use).
[[maybe_unused]] const bool g_quarantine_held_across_fork = (hold_across_fork(&quarantined().mu), true);

}  // namespace

const char* handle_type_name(uint32_t magic) noexcept {
  for (const auto& k : kKinds)
    if (k.magic == magic) return k.type_name;
  return nullptr;
}

std::string handle_problem(const void* h, uint32_t found, uint32_t expected, const char* what) {
  char head[96];
  std::snprintf(head, sizeof head, "%s %p", what, h);
  const std::string type = handle_type_name(expected);
  if (found == kDestroyedMagic)
    return std::string(head) + " was destroyed: a " + type + " cannot be used (or destroyed) again";
  if (const char* other = handle_type_name(found))
    return std::string(head) + " is a " + other + ", not a " + type;
  return std::string(head) + " is not a " + type + " (never created, or destroyed long ago)";
}

void quarantine(Handle* h) noexcept {
  std::unique_ptr<Handle> oldest;  // freed outside the lock
  Quarantine& q = quarantined();
  std::lock_guard lock(q.mu);
  try {
    q.shells.emplace_back(h);
  } catch (...) {
    delete h;  // no memory for the record: free it now
    return;
  }
  if (q.shells.size() > kQuarantine) {
    oldest = std::move(q.shells.front());
    q.shells.pop_front();
  }
}

}  // namespace ferry::capi

extern "C" const char* ferry_last_error(void) { return ferry::capi::t_last_error.c_str(); }
