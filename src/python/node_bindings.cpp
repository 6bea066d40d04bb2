// node_bindings.cpp — the node pool (node/node_pool.h) and this process's
// background registration of it (cuda/node_registration.h), for ferry.node.
// Calls that may wait (open, registration waits, signal-word waits) release
// the GIL; the rest take the region's lock for microseconds and keep it.
// Python checks first that the pool is usable (not closed, not a forked
// child's copy: its region is not mapped there) and what a timeout is.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <memory>
#include <optional>
#include <tuple>

#include "core/options.h"
#include "cuda/node_registration.h"
#include "node/node_pool.h"
#include "node/node_region.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {

using node::NodePool;

namespace {

// (offset, bytes) of the named block `key`, held or not, or nothing: a look for
// messages (a Handoff whose sides differ in size names the other side's values).
// The block is not held, so it may be freed right after; the caller treats what
// it reads there as a hint. (A lookup NodePool itself could offer.)
std::optional<std::tuple<uint64_t, uint64_t>> find_named(NodePool& p, const std::string& key) {
  node::Region region(p.region_base());
  const bool repaired = region.lock();
  const uint32_t i = region.find_named(key);
  std::optional<std::tuple<uint64_t, uint64_t>> found;
  if (i < node::kMaxNamed)
    found = std::make_tuple(region.named(i).first * p.granule(), region.named(i).count * p.granule());
  region.unlock();
  if (repaired) p.reclaim_dead();  // what NodePool's own lock does after a repair
  return found;
}

std::shared_ptr<NodePool> open_pool(const std::string& name, uint64_t capacity, uint64_t granule,
                                    const std::string& label, double timeout_s, const std::string& huge_pages) {
  node::NodePoolOptions o;
  o.huge_pages = parse_huge_policy(huge_pages.empty() ? options().text("FERRY_HUGE_PAGES") : huge_pages);
  o.capacity = capacity;
  o.granule = granule;
  o.label = label;
  o.attach_timeout_s = timeout_s;
  GilRelease unlocked;
  return NodePool::open(name, o);
}

nb::dict pool_stats(NodePool& p) {
  const node::NodePoolStats s = p.stats();
  nb::list members;
  for (const node::HolderInfo& h : s.members) {
    nb::dict d;
    d["slot"] = h.slot;
    d["pid"] = h.pid;
    d["label"] = h.label;
    d["bytes"] = h.bytes;
    d["blocks"] = h.blocks;
    d["named"] = h.named;
    d["this_process"] = h.slot == s.slot;
    members.append(d);
  }
  nb::dict d;
  d["capacity"] = s.capacity;
  d["granule"] = s.granule;
  d["used"] = s.used;
  d["free"] = s.capacity - s.used;
  d["largest_free"] = s.largest_free;
  d["repairs"] = s.repairs;
  d["page_bytes"] = s.page_bytes;
  d["created_here"] = s.created;
  d["members"] = members;
  return d;
}

void bind_node_pool(nb::module_& m) {
  nb::class_<NodePool>(m, "NodePool")
      .def_static("open", &open_pool,
          "name"_a, "capacity"_a, "granule"_a, "label"_a, "timeout_s"_a, "huge_pages"_a = "")
      .def_prop_ro("name", &NodePool::name)
      .def_prop_ro("address", [](const NodePool& p) { return reinterpret_cast<uintptr_t>(p.data()); })
      .def_prop_ro("capacity", &NodePool::capacity)
      .def_prop_ro("granule", &NodePool::granule)
      .def_prop_ro("slot", &NodePool::slot)
      .def("allocate",
           [](NodePool& p, uint64_t bytes) {
             const node::NodeBlock b = p.allocate(bytes);
             return std::make_tuple(b.offset, b.bytes);
           })
      .def("allocate_named",
           [](NodePool& p, const std::string& key, uint64_t bytes) {
             bool created = false;
             const node::NodeBlock b = p.allocate_named(key, bytes, &created);
             return std::make_tuple(b.offset, b.bytes, created);
           })
      .def("find", [](NodePool& p, uint64_t offset) { return p.find(offset).bytes; })
      .def("find_named", &find_named, "key"_a)
      .def("release", &NodePool::release)
      .def("take", &NodePool::take)
      .def("reclaim_dead", &NodePool::reclaim_dead)
      .def("describe_holders", &NodePool::describe_holders)
      .def("stats", &pool_stats)
      .def("add", &NodePool::add)
      .def("load", &NodePool::load)
      .def("wait_at_least", [](const NodePool& p, uint64_t offset, uint32_t value, double timeout_s) {
        GilRelease unlocked;
        return p.wait_at_least(offset, value, timeout_s);
      });
}

void bind_node_registration(nb::module_& m) {
  nb::class_<cuda::NodeRegistration>(m, "NodeRegistration")
      .def("__init__",
           [](cuda::NodeRegistration* r, std::shared_ptr<NodePool> pool, int device) {
             new (r) cuda::NodeRegistration(std::move(pool), device);
           })
      .def_prop_ro("device", &cuda::NodeRegistration::device)
      .def_prop_ro("piece_bytes", &cuda::NodeRegistration::piece_bytes)
      .def("touch", &cuda::NodeRegistration::touch)
      .def("ready", &cuda::NodeRegistration::ready)
      .def("wait",
           [](cuda::NodeRegistration& r, uint64_t offset, uint64_t bytes) {
             GilRelease unlocked;
             r.wait(offset, bytes);
           })
      .def("registered_bytes", &cuda::NodeRegistration::registered_bytes)
      .def("close", [](cuda::NodeRegistration&) {});
}

}  // namespace

void bind_node(nb::module_& m) {
  bind_node_pool(m);
  bind_node_registration(m);
}

}  // namespace ferry::python
