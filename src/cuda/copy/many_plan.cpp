// many_plan.cpp — a copy_many call's items by path (many_plan.h).
#include "cuda/copy/many_plan.h"

#include "cuda/pointer_lookup.h"

namespace ferry::cuda {

namespace {

size_t pinned_mean_bytes(std::span<const CopyOp> ops, std::span<const CopyPair> pairs) {
  size_t bytes = 0, count = 0;
  for (size_t i = 0; i < ops.size(); ++i)
    if (pairs[i].host_pinned || pairs[i].device_to_device) bytes += ops[i].bytes, ++count;
  return count ? bytes / count : 0;
}

}  // namespace

ManyPlan plan_many(std::span<const CopyOp> ops, std::span<const CopyPair> pairs, CallKind call,
                   const MachineProfile& profile, Strategy requested, PointerLookup& lookup) {
  ManyPlan p;
  const size_t mean = pinned_mean_bytes(ops, pairs);
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    CopyFacts facts = copy_facts(pairs[i], op.bytes, call);
    facts.batch_pinned_mean_bytes = mean;
    const Route r = choose_route(facts, profile, requested);
    p.routes.push_back(r);
    p.total += op.bytes;
    if (op.bytes > p.largest) p.largest = op.bytes, p.main = r.strategy;
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
        p.eager[static_cast<int>(pairs[i].dir)].push_back({op.dst, op.src, op.bytes});
        break;
      case Path::cuda:
      case Path::streamed:
      case Path::pin_in_place:
        p.single.push_back(i);
        break;
    }
  }
  return p;
}

}  // namespace ferry::cuda
