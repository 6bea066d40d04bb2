// capi_handoff.cpp — C API over the node handoff (node/handoff.h): the
// protocol, with this layer's copy engine (a handle's own, for its device) on
// the pool route and cuda::IpcRing on the peer route; device -1 copies with
// memcpy (host memory on both ends).
//
// Locking: none here; a handle's calls come one at a time (the Handoff refuses
// a concurrent second call).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "capi/guard.h"
#include "capi/struct_size.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/ipc_ring.h"
#include "node/handoff.h"

using ferry::capi::guarded;
using ferry::capi::live;
using ferry::capi::require;

namespace ferry::capi {
// capi_node.cpp: the pool behind a live ferry_node_pool_t.
std::shared_ptr<node::NodePool> node_pool_of(ferry_node_pool_t pool);
}  // namespace ferry::capi

struct ferry_handoff : ferry::capi::HandleOf<ferry::capi::kHandoffMagic> {
  std::unique_ptr<ferry::cuda::CopyEngine> engine;  // device >= 0; outlives the handoff (declared first)
  std::unique_ptr<ferry::node::Handoff> handoff;
};

namespace {

ferry_handoff_options_t defaults() {
  const ferry::node::HandoffOptions d;
  ferry_handoff_options_t o{};
  o.struct_size = sizeof o;
  o.slots = d.slots;
  o.route = FERRY_HANDOFF_ROUTE_AUTO;
  o.slot_bytes = d.slot_bytes;
  o.timeout_s = d.timeout_s;
  o.poll_s = d.poll_s;
  o.peer_sms = ferry::cuda::kDefaultHandoffPeerSms;
  return o;
}

ferry::node::HandoffRoute route_of(uint32_t r) {
  switch (r) {
    case FERRY_HANDOFF_ROUTE_AUTO: return ferry::node::HandoffRoute::automatic;
    case FERRY_HANDOFF_ROUTE_POOL: return ferry::node::HandoffRoute::pool;
    case FERRY_HANDOFF_ROUTE_PEER: return ferry::node::HandoffRoute::peer;
  }
  throw ferry::InvalidArgument("options->route=" + std::to_string(r) +
                               ": expected FERRY_HANDOFF_ROUTE_AUTO (0), _POOL (1) or _PEER (2)");
}

// The caller's options over the defaults (NULL: the defaults); *peer_sms: the
// device ring's SMs (cuda::IpcRing's, not the protocol's).
ferry::node::HandoffOptions to_cpp(const ferry_handoff_options_t* given, int* peer_sms) {
  const ferry_handoff_options_t c = ferry::capi::options_or(given, defaults());
  ferry::node::HandoffOptions o;
  o.slots = c.slots;
  o.slot_bytes = c.slot_bytes;
  o.timeout_s = c.timeout_s;
  o.poll_s = c.poll_s;
  o.route = route_of(c.route);
  if (c.peer_sms < 0 || c.peer_sms > 1024)
    throw ferry::InvalidArgument("options->peer_sms=" + std::to_string(c.peer_sms) +
                                 ": expected 0 (copy engines only) to 1024");
  if (c.reserved != 0) throw ferry::InvalidArgument("options->reserved: must be 0");
  *peer_sms = c.peer_sms;
  return o;
}

void require_items(const void* items, const uint64_t* sizes, size_t count, const char* what) {
  if (count == 0) return;
  require(items, what);
  require(sizes, "sizes");
}

}  // namespace

extern "C" {

ferry_status_t ferry_handoff_options_defaults(ferry_handoff_options_t* out) {
  return guarded([&] {
    require(out, "out");
    ferry::capi::write_struct(out, defaults(), "out");
  });
}

ferry_status_t ferry_handoff_open(ferry_node_pool_t pool, const char* key, const ferry_handoff_options_t* options,
                                  int device, ferry_handoff_t* out) {
  return guarded([&] {
    std::shared_ptr<ferry::node::NodePool> p = ferry::capi::node_pool_of(pool);
    require(key, "key");
    require(out, "out");
    int peer_sms = 0;
    const ferry::node::HandoffOptions o = to_cpp(options, &peer_sms);
    if (device < -1) throw ferry::InvalidArgument("device=" + std::to_string(device) + ": expected a GPU, or -1");
    auto h = std::make_unique<ferry_handoff>();
    std::unique_ptr<ferry::node::HandoffMover> mover;
    std::unique_ptr<ferry::node::HandoffDevice> ring;
    if (device < 0) {
      mover = std::make_unique<ferry::node::HandoffCopyMover>(ferry::node::host_copy_many);
    } else {
      h->engine = std::make_unique<ferry::cuda::CopyEngine>(ferry::cuda::CopyEngineOptions::from_environment(device));
      mover = ferry::cuda::engine_handoff_mover(*h->engine);
      if (o.route != ferry::node::HandoffRoute::pool)
        ring = std::make_unique<ferry::cuda::IpcRing>(device, peer_sms);
    }
    h->handoff = std::make_unique<ferry::node::Handoff>(p, key, o, std::move(mover), std::move(ring));
    if (device >= 0) {  // the pool route's slots pinned for this device
      const ferry::node::NodeBlock b = h->handoff->block();
      const ferry_status_t s = ferry_node_pool_register(pool, device, b.offset, b.bytes);
      if (s != FERRY_SUCCESS) throw ferry::Error(s, ferry_last_error());
    }
    *out = h.release();
  });
}

ferry_status_t ferry_handoff_destroy(ferry_handoff_t handoff) {
  return guarded([&] {
    ferry::capi::destroy(handoff, "handoff", [](ferry_handoff& h) {
      h.handoff.reset();  // closes: lets go of the block, the ring
      h.engine.reset();
    });
  });
}

ferry_status_t ferry_handoff_send(ferry_handoff_t handoff, const void* const* srcs, const uint64_t* sizes,
                                  size_t count, uint64_t* stream_bytes) {
  return guarded([&] {
    auto& h = live(handoff, "handoff");
    require_items(srcs, sizes, count, "srcs");
    const uint64_t n = h.handoff->send(srcs, sizes, count);
    if (stream_bytes) *stream_bytes = n;
  });
}

ferry_status_t ferry_handoff_recv(ferry_handoff_t handoff, void* const* dsts, const uint64_t* sizes, size_t count,
                                  uint64_t* stream_bytes) {
  return guarded([&] {
    auto& h = live(handoff, "handoff");
    require_items(dsts, sizes, count, "dsts");
    const uint64_t n = h.handoff->recv(dsts, sizes, count);
    if (stream_bytes) *stream_bytes = n;
  });
}

ferry_status_t ferry_handoff_drain(ferry_handoff_t handoff, double timeout_s) {
  return guarded([&] { live(handoff, "handoff").handoff->drain(timeout_s); });
}

ferry_status_t ferry_handoff_get_stats(ferry_handoff_t handoff, ferry_handoff_stats_t* out) {
  return guarded([&] {
    auto& h = live(handoff, "handoff");
    require(out, "out");
    const ferry::node::HandoffStats s = h.handoff->stats();
    ferry_handoff_stats_t v{};
    v.sent = s.sent;
    v.received = s.received;
    v.pool_slots = s.pool_slots;
    v.peer_slots = s.peer_slots;
    v.last_pool_slots = s.last_pool_slots;
    v.last_peer_slots = s.last_peer_slots;
    v.pending = h.handoff->pending();
    v.sm_batches = s.sm_batches;
    ferry::capi::write_struct(out, v, "out");
  });
}

}  // extern "C"
