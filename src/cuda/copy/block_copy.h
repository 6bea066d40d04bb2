// block_copy.h — copies of many small blocks between pinned host memory and
// device memory done by a few SMs instead of the copy engines: each warp takes
// whole blocks and moves them with 16-byte loads and stores (eight in flight
// per lane) through the host memory's device mapping. For the KV-cache
// pattern (thousands of 4-32 KiB blocks scattered on both sides), where a copy
// engine's per-descriptor setup costs more than the bytes.
//
// The block list travels in device-readable memory (a pinned, device-mapped
// buffer of the engine's, op_buffers.h), not in kernel parameters: one launch
// moves any number of blocks, and the CPU writes 24 bytes per block.
//
// SMs: the grid is `max_sms` thread blocks of 1024 threads, so at most that
// many SMs run copies, whatever else the GPU is doing (a model's kernels keep
// the rest). Warps take groups of blocks (one 24-byte descriptor per lane,
// read at once) in grid-stride order.
#pragma once

#include <cstddef>

typedef struct CUstream_st* cudaStream_t;

namespace ferry::cuda {

struct BlockCopy {
  void* dst;        // device pointer, or a pinned host pointer's device mapping
  const void* src;  // likewise
  size_t bytes;
};

// The longest block the kernel takes as one: longer ones are cut into pieces
// of this size, so that a few long blocks do not leave one warp with them all.
inline constexpr size_t kBlockPieceBytes = size_t{64} << 10;
inline size_t block_pieces(size_t bytes) { return (bytes + kBlockPieceBytes - 1) / kBlockPieceBytes; }

// The default of MachineProfile::batch_sm_max_sms (copy/strategy.h) when 0.
// On the H100 (2026-11-28, 256 MiB of scattered blocks per call, one
// direction) 4 SMs moved as much as 8 or 16: 4 KiB 30.8 / 31.3 / 32 GB/s,
// 16 KiB 45.3 / 45.8 / 45.1, 64 KiB 48.9 / 48.7 / 48.5 host->device; the link
// or the host side is the limit, not the SMs, and each SM more is one that a
// concurrent GEMM loses (16 SMs slowed a bf16 GEMM by 40%).
inline constexpr int kDefaultBlockCopySms = 4;

// Enqueues the copies of `ops[0..count)` on `stream`, on at most `max_sms`
// SMs (0: kDefaultBlockCopySms), in launches of about `launch_bytes_per_sm` x
// SMs each (0: one launch; MachineProfile::batch_sm_launch_bytes says why):
// `total_bytes` (the ops' sum) sets how many, each taking an equal share of
// the ops in order. Preconditions: `ops` is device-readable
// (device memory or the device view of pinned memory) and stays unchanged
// until the kernel has run; each op's bytes <= kBlockPieceBytes and > 0;
// every pointer is device-accessible; ranges do not overlap. The engine's
// device is current. Throws CudaError on a launch failure.
void launch_block_copies(const BlockCopy* ops, size_t count, size_t total_bytes, cudaStream_t stream, int max_sms,
                         size_t launch_bytes_per_sm);

}  // namespace ferry::cuda
