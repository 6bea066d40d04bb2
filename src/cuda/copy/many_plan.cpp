// many_plan.cpp — a copy_many call's items by path (many_plan.h).
#include "cuda/copy/many_plan.h"

#include <string>

#include "core/error.h"
#include "cuda/copy/batch_ranges.h"
#include "cuda/pointer_lookup.h"

namespace ferry::cuda {

namespace {

// The ops that BatchRanges took, merged, and the others with their checked pair.
struct Checked {
  std::vector<RangedItem> ranged;
  std::vector<std::pair<size_t, CopyPair>> others;
};

Checked check_all(std::span<const CopyOp> ops, BatchRanges& ranges, PointerLookup& lookup, int device,
                  size_t& merged) {
  Checked c;
  c.ranged.reserve(ops.size());
  RangedItem item;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ranges.check(ops[i], item)) {
      if (!c.ranged.empty() && BatchRanges::continues(c.ranged.back(), item))
        c.ranged.back().bytes += item.bytes, ++merged;
      else
        c.ranged.push_back(item);
      continue;
    }
    try {
      c.others.emplace_back(i, check_copy_pair(ops[i].dst, ops[i].src, ops[i].bytes, lookup, device));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("item " + std::to_string(i) + " of " + std::to_string(ops.size()) + ": " + e.what());
    }
  }
  return c;
}

size_t pinned_mean_bytes(const Checked& c, std::span<const CopyOp> ops) {
  size_t bytes = 0, count = c.ranged.size();
  for (const RangedItem& r : c.ranged) bytes += r.bytes;
  for (const auto& [i, pair] : c.others)
    if (pair.host_pinned || pair.device_to_device) bytes += ops[i].bytes, ++count;
  return count ? bytes / count : 0;
}

void note(ManyPlan& p, size_t bytes, Strategy s) {
  p.total += bytes;
  if (bytes > p.largest) p.largest = bytes, p.main = s;
}

}  // namespace

ManyPlan plan_many(std::span<const CopyOp> ops, CallKind call, const MachineProfile& profile, Strategy requested,
                   PointerLookup& lookup, int device) {
  ManyPlan p;
  p.items = ops.size();
  BatchRanges ranges(lookup, device);
  const Checked c = check_all(ops, ranges, lookup, device, p.merged);
  const size_t mean = pinned_mean_bytes(c, ops);

  // Ranged items: pinned host memory, so one route per direction.
  Route by_dir[2];
  for (Direction d : {Direction::h2d, Direction::d2h}) {
    CopyFacts f;
    f.dir = d;
    f.backing = HostBacking::pinned;
    f.call = call;
    f.batch_pinned_mean_bytes = mean;
    by_dir[static_cast<int>(d)] = choose_route(f, profile, requested);
  }
  for (const RangedItem& r : c.ranged) {
    const Route& route = by_dir[static_cast<int>(r.dir)];
    p.directions[static_cast<int>(r.dir)] = true;
    note(p, r.bytes, route.strategy);
    if (route.path == Path::sm_kernel)
      p.kernel_ops.push_back({ranges.device_view(r.dst_range, r.dst), ranges.device_view(r.src_range, r.src), r.bytes});
    else
      p.dsts.push_back(r.dst), p.srcs.push_back(r.src), p.sizes.push_back(r.bytes);
  }

  for (const auto& [i, pair] : c.others) {
    const CopyOp& op = ops[i];
    CopyFacts facts = copy_facts(pair, op.bytes, call);
    facts.batch_pinned_mean_bytes = mean;
    const Route r = choose_route(facts, profile, requested);
    p.directions[static_cast<int>(pair.dir)] = true;
    note(p, op.bytes, r.strategy);
    switch (r.path) {
      case Path::sm_kernel:
        // Per registration: two registrations' device mappings are not contiguous.
        split_at_registrations(op.dst, op.src, op.bytes, lookup, [&](void* d, const void* s, size_t n) {
          p.kernel_ops.push_back({lookup.device_view(d), lookup.device_view(s), n});
        });
        break;
      case Path::dma:
        split_at_registrations(op.dst, op.src, op.bytes, lookup, [&](void* d, const void* s, size_t n) {
          p.dsts.push_back(d), p.srcs.push_back(s), p.sizes.push_back(n);
        });
        break;
      case Path::eager:
        p.eager[static_cast<int>(pair.dir)].push_back({op.dst, op.src, op.bytes});
        break;
      case Path::cuda:
      case Path::streamed:
      case Path::pin_in_place:
        p.single.emplace_back(i, r);
        break;
    }
  }
  return p;
}

}  // namespace ferry::cuda
