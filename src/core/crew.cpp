// crew.cpp — spinning worker threads over jobs of numbered pieces, picked from
// lock-free slots.
#include "core/crew.h"

#include <algorithm>
#include <chrono>

#include "core/cpu_relax.h"

namespace ferry {

bool CrewJob::work_one() noexcept {
  uint32_t i = next_.load(std::memory_order_relaxed);
  for (;;) {
    if (i >= published_.load(std::memory_order_acquire)) return false;
    // acquire: the piece's inputs were published before `published_` moved.
    if (next_.compare_exchange_weak(i, i + 1, std::memory_order_acquire, std::memory_order_relaxed)) break;
  }
  run_(context_, i);
  return true;
}

uint32_t CrewJob::work() noexcept {
  uint32_t ran = 0;
  while (work_one()) ++ran;
  return ran;
}

Crew::Crew(int threads, int spin_us, ThreadAffinity affinity)
    : spin_us_(std::max(0, spin_us)), affinity_(affinity.bound() ? std::move(affinity) : ThreadAffinity{}) {
  threads_.reserve(std::max(0, threads));
  for (int i = 0; i < threads; ++i)
    threads_.emplace_back([this] {
      affinity_.apply();
      run_worker();
    });
}

Crew::~Crew() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    stop_flag_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Crew::wake(bool sleepers_too) noexcept {
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_too && sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard lock(mu_);  // a sleeper is between its check and its wait, or waiting
    work_cv_.notify_all();
  }
}

void Crew::post(CrewJob& job, uint32_t published, bool wake_sleepers) {
  job.published_.store(std::min(published, job.total_), std::memory_order_release);
  job.slot_ = -1;
  job.wake_sleepers_ = wake_sleepers;
  if (threads_.empty() || job.total_ <= 1) return;
  for (int i = 0; i < kSlots; ++i) {
    CrewJob* empty = nullptr;
    if (slots_[i].job.compare_exchange_strong(empty, &job, std::memory_order_seq_cst)) {
      job.slot_ = i;
      wake(wake_sleepers);
      return;
    }
  }
}

void Crew::publish(CrewJob& job, uint32_t published) {
  published = std::min(published, job.total_);
  if (published <= job.published_.load(std::memory_order_relaxed)) return;
  job.published_.store(published, std::memory_order_release);
  if (job.slot_ >= 0) wake(job.wake_sleepers_);
}

void Crew::retire(CrewJob& job) noexcept {
  if (job.slot_ < 0) return;
  Slot& slot = slots_[job.slot_];
  slot.job.store(nullptr, std::memory_order_seq_cst);
  // Workers that counted themselves in before the store may still hold the
  // job; they leave after their current piece.
  for (int i = 0; slot.users.load(std::memory_order_seq_cst) != 0; ++i) {
    if (i < 4096)
      cpu_relax();
    else
      std::this_thread::yield();
  }
  job.slot_ = -1;
}

bool Crew::work_some() noexcept {
  bool ran = false;
  for (Slot& slot : slots_) {
    if (!slot.job.load(std::memory_order_relaxed)) continue;  // cheap look first
    slot.users.fetch_add(1, std::memory_order_seq_cst);
    CrewJob* job = slot.job.load(std::memory_order_seq_cst);
    if (job && job->has_work()) ran |= job->work() > 0;
    slot.users.fetch_sub(1, std::memory_order_release);
  }
  return ran;
}

void Crew::run_worker() noexcept {
  using Clock = std::chrono::steady_clock;
  const auto spin = std::chrono::microseconds(spin_us_);
  auto idle_since = Clock::now();
  for (;;) {
    const uint64_t seen = epoch_.load(std::memory_order_seq_cst);
    if (stop_flag_.load(std::memory_order_relaxed)) return;
    if (work_some()) {
      idle_since = Clock::now();
      continue;
    }
    // Nothing to do: look again while the spin lasts, then sleep until the
    // epoch moves (a post or publish) or the crew stops.
    bool moved = false;
    while (Clock::now() - idle_since < spin) {
      // A pause is ~140 cycles on Sapphire Rapids: look at the epoch every
      // few, so a spinning worker joins a new job within ~0.3 us.
      for (int i = 0; i < 4; ++i) cpu_relax();
      if (epoch_.load(std::memory_order_acquire) != seen) {
        moved = true;
        break;
      }
    }
    if (moved) {  // new work, taken or not: the crew is busy, keep spinning
      idle_since = Clock::now();
      continue;
    }
    std::unique_lock lock(mu_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    work_cv_.wait(lock, [&] { return stopping_ || epoch_.load(std::memory_order_seq_cst) != seen; });
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    if (stopping_) return;
    idle_since = Clock::now();
  }
}

}  // namespace ferry
