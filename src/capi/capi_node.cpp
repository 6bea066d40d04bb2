// capi_node.cpp — C API over the node pool (node/node_pool.h) and this
// process's pins of it (cuda/node_registration.h: one per device, made on the
// first ferry_node_pool_register for that device).
//
// Locking: ferry_node_pool::mu guards `pins` (the map, not the registrations,
// which lock themselves); no CUDA call runs under it.
#include <map>
#include <memory>
#include <mutex>

#include "capi/guard.h"
#include "capi/struct_size.h"
#include "core/options.h"
#include "cuda/node_registration.h"
#include "node/node_pool.h"

using ferry::capi::guarded;
using ferry::capi::live;
using ferry::capi::require;

struct ferry_node_pool : ferry::capi::HandleOf<ferry::capi::kNodePoolMagic> {
  std::shared_ptr<ferry::node::NodePool> pool;
  std::mutex mu;
  std::map<int, std::shared_ptr<ferry::cuda::NodeRegistration>> pins;
};

namespace {

ferry_node_pool_options_t defaults() {
  const ferry::node::NodePoolOptions d;
  ferry_node_pool_options_t o{};
  o.struct_size = sizeof o;
  o.capacity = d.capacity;
  o.granule = d.granule;
  o.label = nullptr;
  o.attach_timeout_s = d.attach_timeout_s;
  return o;
}

// The caller's options over the defaults (NULL: the defaults); huge pages as
// FERRY_HUGE_PAGES says (the creator's choice).
ferry::node::NodePoolOptions to_cpp(const ferry_node_pool_options_t* given) {
  const ferry_node_pool_options_t c = ferry::capi::options_or(given, defaults());
  ferry::node::NodePoolOptions o;
  o.capacity = c.capacity;
  o.granule = c.granule;
  o.label = c.label ? c.label : "";
  o.attach_timeout_s = c.attach_timeout_s;
  o.huge_pages = ferry::parse_huge_policy(ferry::options().text("FERRY_HUGE_PAGES"));
  return o;
}

}  // namespace

namespace ferry::capi {
// For capi_handoff.cpp: the pool behind a live handle (InvalidArgument otherwise).
std::shared_ptr<node::NodePool> node_pool_of(ferry_node_pool_t pool) { return live(pool, "pool").pool; }
}  // namespace ferry::capi

extern "C" {

ferry_status_t ferry_node_pool_options_defaults(ferry_node_pool_options_t* out) {
  return guarded([&] {
    require(out, "out");
    ferry::capi::write_struct(out, defaults(), "out");
  });
}

ferry_status_t ferry_node_pool_open(const char* name, const ferry_node_pool_options_t* options,
                                    ferry_node_pool_t* out) {
  return guarded([&] {
    require(name, "name");
    require(out, "out");
    auto h = std::make_unique<ferry_node_pool>();
    h->pool = ferry::node::NodePool::open(name, to_cpp(options));
    *out = h.release();
  });
}

ferry_status_t ferry_node_pool_destroy(ferry_node_pool_t pool) {
  return guarded([&] {
    ferry::capi::destroy(pool, "pool", [](ferry_node_pool& h) {
      h.pins.clear();  // unpins first
      h.pool.reset();
    });
  });
}

ferry_status_t ferry_node_pool_close(ferry_node_pool_t pool) { return ferry_node_pool_destroy(pool); }

ferry_status_t ferry_node_pool_data(ferry_node_pool_t pool, void** data, size_t* capacity) {
  return guarded([&] {
    auto& h = live(pool, "pool");
    require(data, "data");
    require(capacity, "capacity");
    *data = h.pool->data();
    *capacity = h.pool->capacity();
  });
}

ferry_status_t ferry_node_pool_alloc(ferry_node_pool_t pool, size_t bytes, uint64_t* handle, size_t* block_bytes) {
  return guarded([&] {
    auto& h = live(pool, "pool");
    require(handle, "handle");
    const ferry::node::NodeBlock b = h.pool->allocate(bytes);
    *handle = b.offset;
    if (block_bytes) *block_bytes = b.bytes;
  });
}

ferry_status_t ferry_node_pool_alloc_named(ferry_node_pool_t pool, const char* key, size_t bytes, uint64_t* handle,
                                           size_t* block_bytes, int* created) {
  return guarded([&] {
    auto& h = live(pool, "pool");
    require(key, "key");
    require(handle, "handle");
    bool made = false;
    const ferry::node::NodeBlock b = h.pool->allocate_named(key, bytes, &made);
    *handle = b.offset;
    if (block_bytes) *block_bytes = b.bytes;
    if (created) *created = made ? 1 : 0;
  });
}

ferry_status_t ferry_node_pool_find(ferry_node_pool_t pool, uint64_t handle, size_t* block_bytes) {
  return guarded([&] {
    auto& h = live(pool, "pool");
    require(block_bytes, "block_bytes");
    *block_bytes = h.pool->find(handle).bytes;
  });
}

ferry_status_t ferry_node_pool_release(ferry_node_pool_t pool, uint64_t handle) {
  return guarded([&] { live(pool, "pool").pool->release(handle); });
}

ferry_status_t ferry_node_pool_take(ferry_node_pool_t pool, uint64_t handle) {
  return guarded([&] { live(pool, "pool").pool->take(handle); });
}

ferry_status_t ferry_node_pool_add(ferry_node_pool_t pool, uint64_t offset, uint32_t n, uint32_t* before) {
  return guarded([&] {
    const uint32_t b = live(pool, "pool").pool->add(offset, n);
    if (before) *before = b;
  });
}

ferry_status_t ferry_node_pool_wait(ferry_node_pool_t pool, uint64_t offset, uint32_t value, double timeout_s,
                                    int* reached) {
  return guarded([&] {
    auto& h = live(pool, "pool");
    require(reached, "reached");
    *reached = h.pool->wait_at_least(offset, value, timeout_s) ? 1 : 0;
  });
}

ferry_status_t ferry_node_pool_register(ferry_node_pool_t pool, int device, uint64_t offset, size_t bytes) {
  return guarded([&] {
    auto& h = live(pool, "pool");
    std::shared_ptr<ferry::cuda::NodeRegistration> pins;
    {
      std::lock_guard<std::mutex> lock(h.mu);
      auto& slot = h.pins[device];
      if (!slot) slot = std::make_shared<ferry::cuda::NodeRegistration>(h.pool, device);
      pins = slot;
    }
    pins->wait(offset, bytes);
  });
}

}  // extern "C"
