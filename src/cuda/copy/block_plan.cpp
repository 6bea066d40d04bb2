// block_plan.cpp — a block list made once, launched many times (block_plan.h).
#include "cuda/copy/block_plan.h"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/fork.h"
#include "cuda/copy/block_copy.h"
#include "cuda/copy/many_plan.h"
#include "cuda/cuda_check.h"
#include "cuda/pointer_lookup.h"
#include "cuda/scoped_device.h"

namespace ferry::cuda {

BlockPlan::BlockPlan(CopyEngine& engine, std::span<const CopyOp> ops, int max_sms) {
  const CopyEngineOptions& o = engine.options();
  device_ = o.device;
  generation_ = fork_generation();
  max_sms_ = max_sms > 0 ? max_sms : o.profile.batch_sm_max_sms;
  launch_bytes_ = o.profile.batch_sm_launch_bytes;
  if (ops.empty()) throw InvalidArgument("block plan: no items");
  ScopedDevice on(device_);
  check(cudaSetDevice(device_), "cudaSetDevice");  // binds the context for the pointer queries
  PointerLookup lookup;
  const ManyPlan p = plan_many(ops, CallKind::copy_many, o.profile, Strategy::sm, lookup, device_);
  if (!p.dsts.empty() || !p.eager[0].empty() || !p.eager[1].empty() || !p.single.empty())
    throw InvalidArgument("block plan: every item must copy between pinned host memory and device memory of device " +
                          std::to_string(device_) + " (register or pool-allocate the host side; " +
                          "use copy_many for pageable memory)");
  std::vector<BlockCopy> pieces;
  for (const BlockCopy& op : p.kernel_ops)
    for (size_t at = 0; at < op.bytes; at += kBlockPieceBytes)
      pieces.push_back({static_cast<char*>(op.dst) + at, static_cast<const char*>(op.src) + at,
                        std::min(kBlockPieceBytes, op.bytes - at)});
  check(cudaMalloc(reinterpret_cast<void**>(&ops_), pieces.size() * sizeof(BlockCopy)), "cudaMalloc (block plan)");
  const cudaError_t err = cudaMemcpy(ops_, pieces.data(), pieces.size() * sizeof(BlockCopy), cudaMemcpyHostToDevice);
  if (err != cudaSuccess) {
    cudaFree(ops_);
    check(err, "cudaMemcpy (block plan)");
  }
  items_ = ops.size();
  pieces_ = pieces.size();
  bytes_ = p.total;
}

BlockPlan::~BlockPlan() {
  if (ops_ && generation_ == fork_generation()) cudaFree(ops_);  // no CUDA call in a forked child
}

void BlockPlan::launch(cudaStream_t stream) const {
  if (generation_ != fork_generation()) throw NotSupported(forked_child_message("this ferry block plan"));
  ScopedDevice on(device_);
  launch_block_copies(ops_, pieces_, bytes_, stream, max_sms_, launch_bytes_);
}

}  // namespace ferry::cuda
