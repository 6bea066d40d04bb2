// eager_copy.cpp — the eager staged copy (see eager_copy.h): the caller's loop
// that publishes chunks to the crew, issues their DMAs and helps copy.
#include "cuda/copy/eager_copy.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "copy/host_copy.h"
#include "copy/staging_plan.h"
#include "core/crew.h"
#include "core/cpu_relax.h"
#include "core/error.h"
#include "core/fault.h"
#include "cuda/cuda_check.h"
#include "cuda/staging_area.h"

namespace ferry::cuda {

namespace {

// Smaller runs are staged by the caller alone: below this, waking and
// coordinating workers cost more than they save (H200: 64 KiB took 16 us alone,
// 29 us with the crew).
constexpr size_t kCrewMinBytes = 128u << 10;
// Runs of at least this many bytes wake sleeping crew threads; smaller ones
// take help only from threads still spinning after earlier work (waking a
// thread costs the poster futex calls and the thread 15-35 us to start).
constexpr size_t kWakeSleepersMinBytes = 1u << 20;
// Device->host runs of at least this many bytes copy out with streaming
// stores and drop the staging lines from the caches (see host_copy.h); for
// smaller ones the user's buffer is likely cached and plain stores win.
constexpr size_t kStreamOutMinBytes = 512u << 10;

// State shared by the caller and the crew threads for one run.
struct EagerRun {
  Direction dir;
  bool stream_out;  // device->host: streaming stores and eviction (kStreamOutMinBytes)
  std::span<const EagerItem> items;
  const StagingPlan& plan;
  unsigned char* area;
  std::unique_ptr<std::atomic<uint32_t>[]> remaining;  // per chunk: pieces not yet copied
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  std::exception_ptr error;  // error_mu: the first error of a piece

  EagerRun(Direction d, bool s, std::span<const EagerItem> it, const StagingPlan& p, unsigned char* a)
      : dir(d), stream_out(s), items(it), plan(p), area(a), remaining(new std::atomic<uint32_t>[p.chunks.size()]) {
    for (size_t k = 0; k < p.chunks.size(); ++k) remaining[k].store(p.chunks[k].pieces, std::memory_order_relaxed);
  }

  void fail(std::exception_ptr e) noexcept {
    std::lock_guard lock(error_mu);
    if (!error) error = e;
    failed.store(true, std::memory_order_release);
  }

  static void run_piece(void* context, uint32_t index) noexcept {
    auto& r = *static_cast<EagerRun*>(context);
    const PlanPiece& p = r.plan.pieces[index];
    if (!r.failed.load(std::memory_order_relaxed)) {
      if (fault_injected(FaultPoint::touch)) {
        r.fail(std::make_exception_ptr(OsError("staging copy (injected fault)", EFAULT)));
      } else if (r.dir == Direction::h2d) {
        copy_to_staging(r.area + p.area_offset, static_cast<const char*>(r.items[p.item].src) + p.item_offset,
                        p.bytes);
      } else if (r.stream_out) {
        copy_from_staging(static_cast<char*>(r.items[p.item].dst) + p.item_offset, r.area + p.area_offset,
                          p.bytes);
        evict_from_caches(r.area + p.area_offset, p.bytes);  // the next DMA into the slot writes faster
      } else {
        std::memcpy(static_cast<char*>(r.items[p.item].dst) + p.item_offset, r.area + p.area_offset, p.bytes);
      }
    }
    r.remaining[p.chunk].fetch_sub(1, std::memory_order_release);  // after the copy (and its fence)
  }

  bool chunk_copied(uint32_t k) const { return remaining[k].load(std::memory_order_acquire) == 0; }
  uint32_t pieces_through(uint32_t chunks) const {  // pieces of chunks [0, chunks)
    if (chunks == 0) return 0;
    const PlanChunk& c = plan.chunks[chunks - 1];
    return c.first_piece + c.pieces;
  }
};

bool event_done(cudaEvent_t e) {
  cudaError_t err = cudaEventQuery(e);
  if (err == cudaErrorNotReady) return false;
  check(err, "cudaEventQuery (staging slot)");
  return true;
}

void enqueue_chunk(const EagerRun& r, const PlanChunk& c, StagingArea& area, cudaStream_t stream) {
  for (uint32_t d = c.first_dma; d < c.first_dma + c.dmas; ++d) {
    const PlanDma& dma = r.plan.dmas[d];
    const EagerItem& item = r.items[dma.item];
    if (r.dir == Direction::h2d)
      check(cudaMemcpyAsync(static_cast<char*>(item.dst) + dma.item_offset, r.area + dma.area_offset, dma.bytes,
                            cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync (staged H2D)");
    else
      check(cudaMemcpyAsync(r.area + dma.area_offset, static_cast<const char*>(item.src) + dma.item_offset,
                            dma.bytes, cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync (staged D2H)");
  }
  check(cudaEventRecord(area.slot_done(c.slot), stream), "cudaEventRecord (staging slot)");
}

// Host->device: publish a chunk's pieces once its slot is free, issue its DMAs
// once they are copied.
void drive_h2d(EagerRun& r, CrewJob& job, Crew& crew, StagingArea& area, cudaStream_t stream) {
  const auto& chunks = r.plan.chunks;
  const uint32_t n = static_cast<uint32_t>(chunks.size()), slots = area.geometry().slots;
  uint32_t published = 0, issued = 0;
  while (issued < n) {
    bool progressed = false;
    // A slot is free once the chunk before in it (this copy's, else an earlier
    // copy's) has its DMA enqueued and done.
    while (published < n && (published < slots || published - slots < issued) &&
           event_done(area.slot_done(chunks[published].slot))) {
      ++published;
      crew.publish(job, r.pieces_through(published));
      progressed = true;
    }
    while (issued < published && r.chunk_copied(issued) && !r.failed.load(std::memory_order_acquire)) {
      enqueue_chunk(r, chunks[issued++], area, stream);
      progressed = true;
    }
    if (r.failed.load(std::memory_order_acquire)) return;
    if (!progressed && !job.work_one()) cpu_relax();
  }
}

// Device->host: issue a chunk's DMAs once its slot is free, publish its pieces
// once they landed, until every piece is out.
void drive_d2h(EagerRun& r, CrewJob& job, Crew& crew, StagingArea& area, cudaStream_t stream) {
  const auto& chunks = r.plan.chunks;
  const uint32_t n = static_cast<uint32_t>(chunks.size()), slots = area.geometry().slots;
  uint32_t issued = 0, published = 0, out = 0;  // out: chunks fully copied out, in order
  while (out < n) {
    bool progressed = false;
    while (issued < n && (issued < slots ? event_done(area.slot_done(chunks[issued].slot))
                                         : issued - slots < out)) {
      enqueue_chunk(r, chunks[issued++], area, stream);
      progressed = true;
    }
    while (published < issued && event_done(area.slot_done(chunks[published].slot))) {
      ++published;
      crew.publish(job, r.pieces_through(published));
      progressed = true;
    }
    while (out < published && r.chunk_copied(out)) ++out, progressed = true;
    if (r.failed.load(std::memory_order_acquire)) return;
    if (!progressed && !job.work_one()) cpu_relax();
  }
}

}  // namespace

bool run_eager(Direction dir, std::span<const EagerItem> items, StagingArea& area, Crew& crew,
               cudaStream_t stream, bool wait) {
  std::vector<size_t> sizes(items.size());
  size_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) total += sizes[i] = items[i].bytes;
  StagingGeometry g = area.geometry();
  g.piece_bytes = piece_bytes_for(total, g.chunk_bytes, crew.threads() + 1);
  const StagingPlan plan = plan_staging(sizes, g);
  if (plan.chunks.empty()) return false;

  static Crew alone(0, 0);  // no threads: post/publish/retire only count
  Crew& helpers = total < kCrewMinBytes ? alone : crew;
  EagerRun run(dir, total >= kStreamOutMinBytes, items, plan, area.base());
  CrewJob job(&EagerRun::run_piece, &run, static_cast<uint32_t>(plan.pieces.size()));
  helpers.post(job, 0, /*wake_sleepers=*/total >= kWakeSleepersMinBytes);
  try {
    if (dir == Direction::h2d)
      drive_h2d(run, job, helpers, area, stream);
    else
      drive_d2h(run, job, helpers, area, stream);
  } catch (...) {
    run.fail(std::current_exception());
  }
  helpers.retire(job);  // no crew thread touches the items after this
  if (run.failed.load(std::memory_order_acquire)) std::rethrow_exception(run.error);
  if (dir == Direction::h2d && wait) {
    check(cudaEventSynchronize(area.slot_done(plan.chunks.back().slot)), "cudaEventSynchronize (staged copy)");
    return false;
  }
  return dir == Direction::h2d;
}

}  // namespace ferry::cuda
