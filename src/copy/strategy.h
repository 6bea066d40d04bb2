// strategy.h — which engine moves a copy, and the machine profile it is chosen
// from. Pure: no CUDA, no system calls (the backing is read by the caller).
//
// Strategies:
//   direct        host memory is pinned: one DMA (cudaMemcpyAsync) per copy;
//   staged        pageable host memory through pinned staging memory, CPU copy of
//                 chunk i+1 overlapping the DMA of chunk i: "eager" (the caller
//                 issues each DMA once its chunk is staged: synchronous copies,
//                 async host->device copies below eager_async_below_bytes) or
//                 stream-ordered (everything enqueued at once, the GPU waits on
//                 CPU flags: other async copies);
//   pin_in_place  register the user's buffer in 2 MiB-aligned pieces ahead of the
//                 DMA, unregister behind it;
//   hybrid        staged and pin_in_place at once on different parts;
//   cuda          the CUDA runtime's own pageable path (small copies: its fixed
//                 cost is lower than any pipeline's);
//   sm            pinned host memory only: a copy kernel on a few SMs moves the
//                 bytes (for batches of small blocks; never chosen by itself).
//
// A strategy asked for is a request about the memory it fits, and choose()
// maps it when the memory is of the other kind (the copy's strategy() says
// what ran):
//   pinned memory     staged, pin_in_place, hybrid, cuda -> direct (there is
//                     nothing to stage or pin: one DMA); sm stays sm;
//   pageable memory   direct -> cuda (the runtime's "direct" call on pageable
//                     memory is its own pageable path); sm -> staged (the kernel
//                     needs pinned memory, staging makes it so).
#pragma once

#include <cstddef>
#include <string>

namespace ferry {

enum class Strategy { automatic, direct, staged, pin_in_place, hybrid, cuda, sm };
constexpr int kStrategyCount = 7;
enum class Direction { h2d = 0, d2h = 1 };
enum class HostBacking { pinned, small_pages, thp, hugetlb, shmem, shmem_thp, unknown };

const char* strategy_name(Strategy s) noexcept;
const char* direction_name(Direction d) noexcept;
const char* backing_name(HostBacking b) noexcept;
// "auto", "direct", "staged", "pin-in-place", "hybrid", "cuda", "sm"; throws
// InvalidArgument quoting the text and listing the choices.
Strategy parse_strategy(const std::string& text);

// What the engine knows about this machine; `ferry bench copy --calibrate`
// measures it, defaults() are the H200 machine's figures (docs/findings.md).
struct MachineProfile {
  // Smaller pageable copies use the CUDA path, per direction (h2d, d2h). 0:
  // none (the eager staged copy beats CUDA's own at every size on the H200
  // machine). Profile keys cuda_below_bytes_h2d / _d2h; cuda_below_bytes sets both.
  size_t cuda_below_bytes[2] = {0, 0};
  // The eager staged copy's areas: chunks of eager_chunk_bytes (the largest
  // DMA), eager_slots of them per area (32 MiB: small enough to stay in the
  // CPU's caches), at most eager_areas areas (copies running at once).
  size_t eager_chunk_bytes = 2u << 20;
  int eager_slots = 16;
  int eager_areas = 4;
  // Async host->device copies at least this big take the stream-ordered
  // pipeline, which returns before the copy is staged; smaller ones are
  // staged before the call returns (their sources may be reused at once).
  size_t eager_async_below_bytes = 64u << 20;
  // The stream-ordered pipeline (async device->host, big async host->device):
  size_t staging_chunk_bytes = 4u << 20;    // bytes per staging slot (largest chunk)
  int staging_slots = 16;                   // slots per lane (chunks in flight)
  int workers = 0;                          // copy threads; 0 = cores, at most 16
  size_t hybrid_below_bytes = 64u << 20;    // smaller copies are not split
  double hybrid_pinned_share[2] = {0.0, 0.0};  // share of the body pinned in place, per direction
  size_t pin_piece_bytes = 64u << 20;       // bytes per registration in pin-in-place
  // Batches of pinned<->device blocks averaging fewer bytes (after adjacent
  // blocks are merged) go to the SM copy kernel, the rest to the copy engines.
  // `ferry bench blocks --calibrate` measures the point: the smallest size
  // from which the copy engines come within 5% of the kernel (they take no
  // SMs from the model). On the H100 (2026-11-28, 256 MiB of scattered
  // blocks per call, h2d / d2h GB/s, kernel on 4 SMs against one
  // cudaMemcpyBatchAsync): 4 KiB 30.6 / 22.6 against 2.3 / 4.4 (the copy
  // engines' ~1 us per descriptor), 16 KiB 45 / 47 against 5.2 / 22, 64 KiB
  // 48 / 49 against 29 / 30, 128 KiB 49 / 50 against 37 / 38, 256 KiB 50 / 51
  // against 44 / 45, 512 KiB 49 / 51 against 47.5 / 48.3, 1 MiB and up equal.
  // The kernel's cost to a concurrent GEMM is in docs/copies.md. The default
  // is below that calibration, 256 KiB: a later run on the same H100 had the
  // copy engines at 49.5 / 49.6 for 256 KiB (kernel 49.7 / 51.5), both
  // directions at once 72.7 against the kernel's 65.7, and the copy engines
  // take no SMs from a model running beside the copies (a GEMM slowed by
  // 0.5% beside them, by 29% beside the kernel on 4 SMs).
  size_t batch_sm_below_bytes = 256u << 10;
  // SMs the block-copy kernel may use (its grid: one 1024-thread block per
  // SM); 0: the kernel's default (cuda/copy/block_copy.h, 4). Each SM taken
  // is one a concurrent model kernel cannot use while the copy runs.
  int batch_sm_max_sms = 0;
  // Bytes one launch of the block-copy kernel moves per SM at most; a call
  // moving more is cut into several launches in a row on its stream. Why: the
  // kernel holds its SMs until its last block is copied, and a model kernel
  // that wants every SM (a GEMM whose tiles are laid out for all of them) waits
  // for those SMs meanwhile: one 256 MiB launch on 4 SMs per direction slowed
  // a bf16 GEMM beside it by 29% (H100). Between two launches the GPU's
  // scheduler hands the freed SMs to the kernels waiting for them. 0: one
  // launch per call. Measured on one H200 (2026-11-28, `ferry bench blocks
  // --sm-launch-bytes`, 256 MiB scattered per call, 4 SMs; GB/s h2d / d2h /
  // both; a GEMM stream's slowdown beside 4 KiB copies both ways, one run):
  //   one launch   4 KiB 35.7 / 26.4 / 42.3, 64 KiB 50.0 / 50.8 / 63.0; GEMM +36.6%
  //   1 MiB        4 KiB 34.1 / 28.9 / 38.1, 64 KiB 46.4 / 48.3 / 56.9; GEMM +5.9%
  //   256 KiB      4 KiB 29.9 / 26.4 / 34.3, 64 KiB 25.3 / 37.2 / 40.1; GEMM +0.8%
  //   64 KiB       4 KiB 19.8 / 20.0 / 26.8, 64 KiB 6.7 / 16.9 / 12.3
  // (a launch must give each of its 128 warps a few blocks, and each costs a
  // launch's gap). 1 MiB keeps 90-100% of one launch's rate.
  size_t batch_sm_launch_bytes = 1u << 20;

  static MachineProfile defaults();
};

// "key = value" lines, '#' comments. parse throws InvalidArgument naming the
// line and key; unknown keys are errors too (a stale profile must not be half read).
// Ranges: staging_chunk_bytes 4 KiB .. 1 GiB, staging_slots 2 .. 256, workers
// 0 .. 1024, pin_piece_bytes a multiple of 2 MiB up to 64 GiB, shares 0 .. 1,
// eager_chunk_bytes up to 1 GiB, eager_slots 1 .. 4096, eager_areas 1 .. 64,
// batch_sm_launch_bytes 0 or 4 KiB .. 1 GiB.
inline constexpr size_t kMaxStagingChunkBytes = size_t{1} << 30;
inline constexpr int kMaxStagingSlots = 256;
inline constexpr size_t kMaxPinPieceBytes = size_t{64} << 30;
std::string format_profile(const MachineProfile& p);
MachineProfile parse_profile(const std::string& text);

// ---- the choice: every rule that decides how a copy moves is in choose_route ----

// Which engine call asks: the eager/stream-ordered split of `staged` depends on it.
enum class CallKind { copy, copy_async, copy_many, copy_many_async };

// How a strategy runs in the engine (cuda/copy/copy_engine.cpp dispatches on it).
enum class Path {
  dma,           // pinned host memory or device<->device: DMA on the caller's stream
                 // (copy_many: all such items in one cudaMemcpyBatchAsync)
  cuda,          // pageable memory through the CUDA runtime's own path (cudaMemcpyAsync)
  sm_kernel,     // pinned host memory, moved by the block-copy kernel
  eager,         // staged, the caller's thread drives the DMAs (cuda/copy/eager_copy.h)
  streamed,      // staged, stream-ordered pipeline (cuda/copy/copy_engine.h)
  pin_in_place,  // pin-in-place, or hybrid (the profile's pinned share of the body)
};
const char* path_name(Path p) noexcept;

// What is known about one copy when it is decided. The page backing of
// pageable memory is not read by the engine (unknown): /proc/self/smaps costs
// 15-20 ms in a process with many mappings on the H200 machine, as much as a
// copy of 1 GiB.
struct CopyFacts {
  Direction dir = Direction::h2d;
  size_t bytes = 0;
  HostBacking backing = HostBacking::unknown;  // pinned: the driver knows the host memory
  bool device_to_device = false;
  CallKind call = CallKind::copy;
  // copy_many: mean bytes of the batch's items that are pinned or
  // device<->device (0: none, or not a batch).
  size_t batch_pinned_mean_bytes = 0;
};

struct Route {
  Strategy strategy;  // what stats and Completion::strategy() report
  Path path;
  Direction dir;      // facts.dir
};

// THE choice. `requested` != automatic wins (FERRY_COPY_STRATEGY or the call's
// argument), except that pinned host memory always goes direct (or sm when
// asked) and device<->device always direct. With `automatic`, in order:
//   pinned, or device<->device        direct; in a batch whose such items
//                                     average < batch_sm_below_bytes: sm
//   bytes < cuda_below_bytes[dir]     cuda (0 by default: never)
//   bytes >= hybrid_below_bytes and hybrid_pinned_share[dir] > 0
//                                     pin-in-place (share 1) or hybrid
//                                     (share 0 by default: never)
//   else                              staged
// and staged runs eager for copy and copy_many, for copy_many_async h2d and
// for copy_async h2d below eager_async_below_bytes; stream-ordered otherwise.
// The defaults are the H200 machine's; `ferry bench copy --calibrate` prints
// where each strategy wins per size and writes the profile keys above.
Route choose_route(const CopyFacts& facts, const MachineProfile& profile, Strategy requested);

// choose_route(...).strategy of a single synchronous copy.
Strategy choose_strategy(Direction dir, size_t bytes, HostBacking backing,
                         const MachineProfile& profile, Strategy requested = Strategy::automatic);

}  // namespace ferry
