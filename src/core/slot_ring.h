// slot_ring.h — the one concept behind every ring of staging slots in ferry:
// N slots, handed out oldest first, each in one of three states:
//
//   free ──take()──> filling ──hand_off()──> in flight ──(it lands)──> free
//                       └────────── give_back() ──────────────────────┘
//
//   free       nobody writes it, nothing reads it.
//   filling    one thread owns it and writes it (a pread, a memcpy, a DMA
//              into it that this thread waits for).
//   in flight  its bytes are handed to a consumer (DMAs enqueued on a stream,
//              a write queued for a writer thread); nobody may write it until
//              the consumer is done with them. The ring does not know how a
//              consumer says so: that is its user's (an event, a GPU flag, a
//              writer's queue). take() hands out an in-flight slot only
//              together with `landing_pending`, and the taker waits for it to
//              land before writing; the slot is "done" then, i.e. free again.
//
// The users, each an instance of this shape:
//   - the loader's pipeline (load/pipeline.cpp): a SlotRing over the Target's
//     slots; landing = Target::wait_slot_free (the GPU target: the slot's
//     event; the host target: nothing, its copies are done when enqueued),
//     asked before every fill, since the Target's slots outlive one run.
//   - the loader's staging area (cuda/staging_area.h, the GPU Target's
//     slots): through the pipeline's SlotRing above; landing = the slot's
//     event, slept on.
//   - the copy engine's eager staging (cuda/copy/eager_copy.cpp), over a
//     staging area: one thread drives one copy's chunks through the slots in
//     plan order (chunk k in slot k % slots), lock-free and polled for
//     latency: free = the slot's event done, filling = the chunk published to
//     the crew, in flight = its DMA enqueued (drive_h2d / drive_d2h).
//   - the copy engine's lanes (cuda/copy/lane_pool.h): landing = a GPU-written
//     flag per slot; the states are generation numbers the CPU and the GPU
//     kernel write (the protocol in copy_engine.h), not slots a thread takes.
//   - save's ring (load/write_pipeline.cpp, the loader pipeline's twin, for
//     python/ferry/torch/save.py): landing = a writer thread has pwritten the
//     slot's bytes (WriteRun::landed).
//   - the DataLoader's slots (python/ferry/torch/data/slots.py): landing = the
//     batch's event, recorded after the copies that read the slot. A pool
//     more than a ring: slots are made on demand, grow with the batches and
//     are quarantined while a stale worker may write them (states in slots.py).
// The loader's pipeline and save's write pipeline are this class. The eager
// copy and the lanes keep these states in their own lock-free code: a mutex
// on their path would cost the small copies' latency (a 4 KiB copy takes a
// few microseconds), and the lanes' states live in memory the GPU writes.
//
// Locking: mu_ guards order_, state_ and stopped_; no call of the user's (no
// landing wait, no system call) is made under it. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace ferry {

enum class SlotState : uint8_t { free, filling, in_flight };

class SlotRing {
 public:
  static constexpr size_t kStopped = SIZE_MAX;

  explicit SlotRing(size_t slots);

  struct Taken {
    size_t slot = kStopped;        // kStopped: the ring was stopped
    bool landing_pending = false;  // it was in flight: wait for it to land before writing
  };
  // The oldest slot that is not being filled; blocks while every slot is.
  // Its state becomes filling.
  Taken take();
  // The slot's bytes went to a consumer: in flight, back in line (last).
  void hand_off(size_t slot);
  // Nothing was handed off (or it has landed): free, back in line (last).
  void give_back(size_t slot);
  // take() returns kStopped from now on, also in threads blocked in it.
  void stop();

  size_t size() const { return state_.size(); }
  SlotState state(size_t slot) const;

 private:
  void put_back(size_t slot, SlotState s);

  mutable std::mutex mu_;
  std::condition_variable returned_;
  std::deque<size_t> order_;      // slots not being filled, oldest first
  std::vector<SlotState> state_;
  bool stopped_ = false;
};

}  // namespace ferry
