// crew.h — worker threads that stay awake between copies, for work cut into
// numbered pieces that several threads take from one shared counter.
//
// Why not WorkerPool: a copy of 1 MiB lasts ~30 us on the link, and a sleeping
// thread takes 16-35 us to wake on the H200 VM (scripts/probes/staging-sweep).
// So crew threads spin for `spin_us` after their last piece before they sleep,
// and the thread that posted a job works on it too (CrewJob::work): a job
// progresses from its first microsecond, whether or not any worker is awake.
//
// A job's pieces become available in order: the poster publishes a prefix
// [0, published) and extends it as their inputs become ready (a staging chunk
// freed, a DMA landed); threads take pieces below `published` one at a time.
//
// Jobs sit in a fixed array of slots that workers scan without a lock: on the
// H200 VM, 15 spinning workers rushing for one mutex at every post cost a
// small copy ~13 us. A worker counts itself into a slot (slot.users) BEFORE it
// reads the slot's job; retire() empties the slot, then waits until its users
// are gone (both seq_cst: either the worker sees the empty slot or retire sees
// the worker). A posted job with no free slot is simply run by its poster.
//
// Locking: mu_ guards stopping_ and pairs with work_cv_ for sleeping workers
// only. epoch_ and sleepers_ form a Dekker pair (seq_cst): a publisher bumps
// epoch_ then reads sleepers_; a worker going to sleep bumps sleepers_ (under
// mu_) then re-reads epoch_, so one of them always sees the other.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "core/thread_affinity.h"

namespace ferry {

class Crew;

// Pieces [0, total) of one job. `run` does one piece; it must not throw (the
// job's owner records errors in its own state).
class CrewJob {
 public:
  using RunFn = void (*)(void* context, uint32_t piece) noexcept;
  CrewJob(RunFn run, void* context, uint32_t total) noexcept : run_(run), context_(context), total_(total) {}
  CrewJob(const CrewJob&) = delete;
  CrewJob& operator=(const CrewJob&) = delete;

  // Runs published pieces that nobody took yet, until there are none; returns
  // how many this thread ran. Any thread may call it.
  uint32_t work() noexcept;
  // Runs at most one piece; false if none was available.
  bool work_one() noexcept;
  uint32_t total() const noexcept { return total_; }
  uint32_t published() const noexcept { return published_.load(std::memory_order_acquire); }

 private:
  friend class Crew;
  bool has_work() const noexcept {
    return next_.load(std::memory_order_relaxed) < published_.load(std::memory_order_acquire);
  }

  const RunFn run_;
  void* const context_;
  const uint32_t total_;
  std::atomic<uint32_t> next_{0};       // first piece not yet taken
  std::atomic<uint32_t> published_{0};  // pieces [0, published_) may be taken
  int slot_ = -1;                       // the poster's: the slot it holds, or -1
  bool wake_sleepers_ = true;           // the poster's
};

class Crew {
 public:
  static constexpr int kSlots = 16;  // jobs running at once (copies in flight)

  // threads >= 0 workers (0: the posting thread does all the work); spin_us:
  // how long an idle worker keeps looking for work before it sleeps; each
  // worker applies `affinity` as it starts.
  Crew(int threads, int spin_us, ThreadAffinity affinity = {});
  ~Crew();  // joins; no job may still be posted
  Crew(const Crew&) = delete;
  Crew& operator=(const Crew&) = delete;

  // Makes the job visible to the workers with its first `published` pieces.
  // A job of one piece is not posted (waking a worker costs more than the
  // piece), nor one that finds every slot taken: its poster runs it alone.
  // wake_sleepers = false: only workers still spinning help (a small job
  // should not pay the futex calls that wake sleeping threads).
  void post(CrewJob& job, uint32_t published, bool wake_sleepers = true);
  // More pieces are ready (published only grows, up to total()).
  void publish(CrewJob& job, uint32_t published);
  // Takes the job out; when this returns no worker touches it any more (a
  // worker in the middle of a piece finishes it first). Call it on every
  // posted job, also on error paths, before the job's memory goes away.
  void retire(CrewJob& job) noexcept;

  int threads() const noexcept { return static_cast<int>(threads_.size()); }
  // The CPUs the workers were bound to; empty when they were not.
  const std::vector<int>& cpus() const noexcept { return affinity_.cpus; }

 private:
  struct alignas(64) Slot {
    std::atomic<CrewJob*> job{nullptr};
    std::atomic<int> users{0};  // workers that may be looking at `job`
  };

  void run_worker() noexcept;
  bool work_some() noexcept;  // a worker's pass over the slots; true if it ran a piece
  void wake(bool sleepers_too) noexcept;

  const int spin_us_;
  const ThreadAffinity affinity_;
  Slot slots_[kSlots];
  std::mutex mu_;
  std::condition_variable work_cv_;  // new work or stopping (sleepers wait here)
  bool stopping_ = false;            // mu_
  std::atomic<bool> stop_flag_{false};
  std::atomic<uint64_t> epoch_{0};   // bumped on every post and publish
  std::atomic<int> sleepers_{0};     // written under mu_
  std::vector<std::thread> threads_;
};

}  // namespace ferry
