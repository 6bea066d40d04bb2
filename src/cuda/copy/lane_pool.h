// lane_pool.h — the lanes of the stream-ordered pipeline (streamed_copy.cpp,
// protocol in copy_engine.h): a lane is one stream, its staging slots and
// their flags in mapped pinned memory.
//
// A lane is lent to one copy at a time (LanePool::acquire/release, HeldLane
// for a scope), so its generations are handed out in stream order without a
// lock around CUDA calls; copies on the same lane follow each other on its
// stream. At most kMaxLanes lanes per direction, made on demand.
//
// Locking: each direction's Lender (core/lender.h) has its mutex over its free
// and made lanes; the CUDA calls that make a lane run outside it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "copy/strategy.h"
#include "core/lender.h"

typedef struct CUstream_st* cudaStream_t;

namespace ferry {
class Pool;
}

namespace ferry::cuda {

struct Lane {
  Direction dir;
  cudaStream_t stream = nullptr;
  std::vector<unsigned char*> slots;
  size_t slot_bytes = 0;
  volatile uint64_t* cpu_flags = nullptr;  // h2d: ready[s]; d2h: drained[s] (CPU writes)
  volatile uint64_t* gpu_flags = nullptr;  // h2d: done[s];  d2h: filled[s]  (GPU writes)
  void* flag_block = nullptr;
  uint64_t next_gen = 1;  // the holder's
};

class LanePool {
 public:
  // Two lanes per direction: a second copy enqueues while the first one's
  // chunks still move.
  static constexpr int kMaxLanes = 2;
  LanePool(Pool& staging, const MachineProfile& profile, int device)
      : staging_(staging), profile_(profile), device_(device) {}
  ~LanePool();  // synchronizes each lane's stream
  LanePool(const LanePool&) = delete;
  LanePool& operator=(const LanePool&) = delete;

  // A free lane, else a new one while fewer than kMaxLanes exist, else waits
  // until one is given back. Throws if a new lane cannot be made.
  Lane& acquire(Direction d);
  void release(Lane& lane) noexcept;

 private:
  std::unique_ptr<Lane> make(Direction d);  // CUDA calls: outside the lender's lock
  Pool& staging_;
  const MachineProfile& profile_;
  const int device_;
  Lender<Lane> lent_[2] = {Lender<Lane>(kMaxLanes), Lender<Lane>(kMaxLanes)};  // by Direction
};

// Holds a lane for a scope.
class HeldLane {
 public:
  HeldLane(LanePool& pool, Direction d) : pool_(pool), lane_(pool.acquire(d)) {}
  ~HeldLane() { pool_.release(lane_); }
  HeldLane(const HeldLane&) = delete;
  HeldLane& operator=(const HeldLane&) = delete;
  Lane& operator*() const { return lane_; }

 private:
  LanePool& pool_;
  Lane& lane_;
};

}  // namespace ferry::cuda
