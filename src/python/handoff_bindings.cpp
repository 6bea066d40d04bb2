// handoff_bindings.cpp — the node handoff (node/handoff.h) for
// ferry.node.Handoff (python/ferry/node_handoff.py, which checks the arguments
// and resolves tensors and buffers to addresses first).
//
// The copy function: "engine" (the process's copy engine of `device`, async on
// a stream of the handoff's own: cuda/ipc_ring.h's engine_handoff_mover), "host"
// (memcpy: ferry.node.memmove_many), or a Python callable copy(dsts, srcs,
// sizes) given lists of ints (node_handoff.py makes them int64 arrays), called
// with the GIL taken for that call only. The peer route's device ring
// (cuda::IpcRing) comes with `device` unless route is "pool".
// send, recv and drain release the GIL: they wait for the other process.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/copy/copy_engine.h"
#include "cuda/ipc_ring.h"
#include "node/handoff.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {

using node::Handoff;
using Int64s = nb::ndarray<const int64_t, nb::ndim<1>, nb::device::cpu, nb::c_contig>;

namespace {

// The pool route's mover for a copy mode (see the top of this file).
std::unique_ptr<node::HandoffMover> pool_mover(const std::string& mode, nb::object fn, int device) {
  if (mode == "host") return std::make_unique<node::HandoffCopyMover>(node::host_copy_many);
  if (mode == "engine") {
    nb::object engine = nb::module_::import_("ferry._ferry").attr("engine")(device);
    return cuda::engine_handoff_mover(nb::cast<cuda::CopyEngine&>(engine));
  }
  if (mode != "python") throw InvalidArgument("Handoff: copy mode '" + mode + "'");
  auto held = std::make_shared<nb::object>(std::move(fn));
  return std::make_unique<node::HandoffCopyMover>([held](void* const* d, const void* const* s, const size_t* n, size_t k) {
    nb::gil_scoped_acquire gil;
    nb::list ds, ss, ns;
    for (size_t i = 0; i < k; ++i) {
      ds.append(reinterpret_cast<uintptr_t>(d[i]));
      ss.append(reinterpret_cast<uintptr_t>(s[i]));
      ns.append(n[i]);
    }
    (*held)(ds, ss, ns);
  });
}

std::vector<uint64_t> sizes_of(const Int64s& a) {
  std::vector<uint64_t> v(a.shape(0));
  for (size_t i = 0; i < v.size(); ++i) {
    if (a.data()[i] < 0) throw InvalidArgument("sizes[" + std::to_string(i) + "]=" + std::to_string(a.data()[i]) + ": negative");
    v[i] = static_cast<uint64_t>(a.data()[i]);
  }
  return v;
}

template <class P>
std::vector<P> pointers_of(const Int64s& a) {
  std::vector<P> v(a.shape(0));
  for (size_t i = 0; i < v.size(); ++i) v[i] = reinterpret_cast<P>(static_cast<uintptr_t>(a.data()[i]));
  return v;
}

void check_lengths(const Int64s& addrs, const Int64s& sizes) {
  if (addrs.shape(0) != sizes.shape(0))
    throw InvalidArgument("Handoff: " + std::to_string(addrs.shape(0)) + " addresses and " +
                          std::to_string(sizes.shape(0)) + " sizes");
}

void handoff_init(Handoff* h, std::shared_ptr<node::NodePool> pool, const std::string& key, uint32_t slots,
                  uint64_t slot_bytes, double timeout_s, double poll_s, const std::string& route,
                  const std::string& copy_mode, nb::object copy, int device, int peer_sms) {
  node::HandoffOptions o;
  o.slots = slots;
  o.slot_bytes = slot_bytes;
  o.timeout_s = timeout_s;
  o.poll_s = poll_s;
  o.route = node::parse_handoff_route(route);
  std::unique_ptr<node::HandoffMover> mover = pool_mover(copy_mode, std::move(copy), device);
  std::unique_ptr<node::HandoffDevice> ring;
  if (device >= 0 && o.route != node::HandoffRoute::pool) ring = std::make_unique<cuda::IpcRing>(device, peer_sms);
  GilRelease unlocked;  // the open may wait for the block's maker
  new (h) Handoff(std::move(pool), key, o, std::move(mover), std::move(ring));
}

nb::dict handoff_stats(const Handoff& h) {
  const node::HandoffStats s = h.stats();
  nb::dict d;
  d["sent"] = s.sent;
  d["received"] = s.received;
  d["pool_slots"] = s.pool_slots;
  d["peer_slots"] = s.peer_slots;
  d["last_pool_slots"] = s.last_pool_slots;
  d["last_peer_slots"] = s.last_peer_slots;
  d["sm_batches"] = s.sm_batches;
  d["route_note"] = h.route_note();
  return d;
}

// The protocol's constants and pure parts: the block header, the plan of a
// send, and the host copy.
void bind_handoff_protocol(nb::module_& m) {
  m.attr("HANDOFF_MAGIC") = node::kHandoffMagic;
  m.attr("HANDOFF_ALIGN") = node::kHandoffAlign;
  m.attr("HANDOFF_SLOT_ALIGN") = node::kHandoffSlotAlign;
  m.attr("HANDOFF_MAX_SLOTS") = node::kHandoffMaxSlots;
  m.attr("HANDOFF_HEADER_WORDS") = node::kHandoffHeaderWords;
  m.attr("HANDOFF_META_WORDS") = node::kHandoffMetaWords;
  m.attr("HANDOFF_PEER_SMS") = cuda::kDefaultHandoffPeerSms;
  m.def("handoff_header_bytes", &node::handoff_header_bytes, "slots"_a, "granule"_a);
  m.def(
      "handoff_plan",
      [](const Int64s& sizes, uint64_t slot_bytes) {
        const node::HandoffPlan p = node::plan_handoff(sizes_of(sizes), slot_bytes);
        nb::list pieces, chunks;
        for (const node::HandoffPiece& x : p.pieces) pieces.append(nb::make_tuple(x.item, x.item_offset, x.slot_offset, x.bytes));
        for (size_t c : p.chunks) chunks.append(c);
        return nb::make_tuple(p.stream_bytes, pieces, chunks);
      },
      "sizes"_a, "slot_bytes"_a,
      "(stream bytes, [(item, offset in item, offset in slot, bytes)], chunk bounds): node/handoff.h's plan.");
  m.def("devices_reach", &cuda::devices_reach, "from_device"_a, "to_device"_a,
        "Whether GPU from_device can write GPU to_device's memory (the same GPU, or peer access).");
  m.def(
      "host_copy_many",
      [](const Int64s& dsts, const Int64s& srcs, const Int64s& sizes) {
        check_lengths(dsts, sizes);
        check_lengths(srcs, sizes);
        const auto d = pointers_of<void*>(dsts);
        const auto s = pointers_of<const void*>(srcs);
        const auto n64 = sizes_of(sizes);
        const std::vector<size_t> n(n64.begin(), n64.end());
        GilRelease unlocked;
        node::host_copy_many(d.data(), s.data(), n.data(), n.size());
      },
      "dsts"_a, "srcs"_a, "sizes"_a, "memmove of each item: host memory to host memory.");
}

void bind_handoff_class(nb::module_& m) {
  nb::class_<Handoff>(m, "Handoff")
      .def("__init__", &handoff_init,
           "pool"_a, "key"_a, "slots"_a, "slot_bytes"_a, "timeout_s"_a, "poll_s"_a, "route"_a, "copy_mode"_a,
           "copy"_a.none(), "device"_a, "peer_sms"_a = cuda::kDefaultHandoffPeerSms)
      .def("send",
           [](Handoff& h, const Int64s& srcs, const Int64s& sizes) {
             check_lengths(srcs, sizes);
             const auto s = pointers_of<const void*>(srcs);
             const auto n = sizes_of(sizes);
             GilRelease unlocked;
             return h.send(s.data(), n.data(), n.size());
           })
      .def("recv",
           [](Handoff& h, const Int64s& dsts, const Int64s& sizes) {
             check_lengths(dsts, sizes);
             const auto d = pointers_of<void*>(dsts);
             const auto n = sizes_of(sizes);
             GilRelease unlocked;
             return h.recv(d.data(), n.data(), n.size());
           })
      .def("drain",
           [](Handoff& h, double timeout_s) {
             GilRelease unlocked;
             h.drain(timeout_s);
           })
      .def_prop_ro("pending", &Handoff::pending)
      .def_prop_rw("timeout", &Handoff::timeout, &Handoff::set_timeout)
      .def_prop_ro("slot_bytes", [](const Handoff& h) { return h.options().slot_bytes; })
      .def_prop_ro("block", [](const Handoff& h) { return nb::make_tuple(h.block().offset, h.block().bytes, h.created()); })
      .def_prop_ro("sent", &Handoff::sent)
      .def_prop_ro("received", &Handoff::received)
      .def("stats", &handoff_stats)
      .def("close", [](Handoff& h) {
        GilRelease unlocked;  // a consumer's close may wait for the producer to let go of its ring
        h.close();
      });
}

}  // namespace

void bind_handoff(nb::module_& m) {
  bind_handoff_protocol(m);
  bind_handoff_class(m);
}

}  // namespace ferry::python
