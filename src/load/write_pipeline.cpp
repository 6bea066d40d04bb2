// write_pipeline.cpp — run_write_pipeline: the caller's thread fills slots,
// writer threads write them into an AtomicFile (see write_pipeline.h).
#include "load/write_pipeline.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>

#include "core/error.h"
#include "core/slot_ring.h"
#include "core/worker_pool.h"
#include "load/atomic_file.h"
#include "os/file.h"

namespace ferry::load {
namespace {

constexpr uint64_t kAlign = os::kDirectIoAlignment;

std::string range_of(const AtomicFile& f, uint64_t offset, uint64_t bytes) {
  return f.path() + ", bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) + ")";
}

// One filled slot on its way to a writer.
struct Job {
  size_t slot = 0;
  uint64_t offset = 0;               // in the file
  size_t bytes = 0;                  // unpadded
  const unsigned char* data = nullptr;  // Source::slot(slot) after the fill
};

// The state of one run_write_pipeline call, shared by its writers.
//
// Locking: mu guards queue, closing, landed, error and running. stop and
// the counters are atomic so that writers can use them without the lock.
// The slots' states and order are the ring's (core/slot_ring.h, its
// own lock). No system call and no Source call is made while mu is held.
struct WriteRun {
  WriteRun(AtomicFile& f, Source& s) : file(f), source(s), ring(s.slot_count()), landed(s.slot_count(), 1) {}

  AtomicFile& file;
  Source& source;

  SlotRing ring;                     // landing = a writer wrote the slot (landed[slot])
  std::mutex mu;
  std::condition_variable work_cv;   // a job was queued, or closing: writers wait on it
  std::condition_variable caller_cv; // a slot landed, a writer ended or the run stopped: the caller waits on it
  std::deque<Job> queue;             // guarded by mu; filled slots not yet taken by a writer
  bool closing = false;              // guarded by mu; no more jobs come: writers return once the queue is empty
  std::vector<char> landed;          // guarded by mu; per slot: its last write is done (or skipped)
  std::exception_ptr error;          // guarded by mu; the first failure
  int running = 0;                   // guarded by mu; writers not yet returned
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> written{0}, writes{0};

  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = e;
      stop = true;
      caller_cv.notify_all();
    }
    ring.stop();
  }
  void queue_write(const Job& j) {
    std::lock_guard<std::mutex> lock(mu);
    landed[j.slot] = 0;
    queue.push_back(j);
    work_cv.notify_one();
  }
  // The next job; false once closing and the queue is empty.
  bool next_job(Job* j) {
    std::unique_lock<std::mutex> lock(mu);
    work_cv.wait(lock, [&] { return !queue.empty() || closing; });
    if (queue.empty()) return false;
    *j = queue.front();
    queue.pop_front();
    return true;
  }
  void landed_now(size_t slot) {
    std::lock_guard<std::mutex> lock(mu);
    landed[slot] = 1;
    caller_cv.notify_all();
  }
  // Blocks until the slot's write landed (true) or the run stopped (false).
  bool wait_landed(size_t slot) {
    std::unique_lock<std::mutex> lock(mu);
    caller_cv.wait(lock, [&] { return landed[slot] || stop; });
    return landed[slot] && !stop;
  }
  // A writer's last touch of the run: notified under the lock, so that the
  // caller (which may destroy the run once running is 0) cannot go on first.
  void writer_ended() {
    std::lock_guard<std::mutex> lock(mu);
    --running;
    caller_cv.notify_all();
  }
  void close_and_wait() {
    std::unique_lock<std::mutex> lock(mu);
    closing = true;
    work_cv.notify_all();
    caller_cv.wait(lock, [&] { return running == 0; });
  }
};

void write_job(WriteRun& r, const Job& j) {
  r.source.wait_filled(j.slot);
  r.file.write(j.data, j.bytes, j.offset, true);  // O_DIRECT and its fallback: atomic_file.h
  ++r.writes;
  r.written += j.bytes;
}

void writer(WriteRun& r) {
  for (Job j; r.next_job(&j);) {
    if (!r.stop) {  // after a failure the queue is drained unwritten
      try {
        write_job(r, j);
      } catch (...) {
        r.fail(std::current_exception());
      }
    }
    r.landed_now(j.slot);
  }
}

void launch_writers(WriteRun& r, WorkerPool& pool, int writers) {
  for (int k = 0; k < writers; ++k) {
    {
      std::lock_guard<std::mutex> lock(r.mu);
      ++r.running;
    }
    try {
      pool.submit([&r] {
        writer(r);
        r.writer_ended();
      });
    } catch (...) {  // no memory for the task: stop the others
      r.fail(std::current_exception());
      r.writer_ended();
    }
  }
}

// One slot: taken, landed, filled, handed to the writers. False when the run stopped.
bool fill_one(WriteRun& r, uint64_t at, size_t n) {
  const SlotRing::Taken t = r.ring.take();
  if (t.slot == SlotRing::kStopped) return false;
  if (t.landing_pending && !r.wait_landed(t.slot)) {
    r.ring.give_back(t.slot);
    return false;
  }
  try {
    r.source.fill(t.slot, at, n);
  } catch (const Error& e) {
    r.ring.give_back(t.slot);
    throw Error(e.status(), range_of(r.file, at, n) + ": " + e.what());
  } catch (...) {
    r.ring.give_back(t.slot);
    throw;
  }
  const unsigned char* data = r.source.slot(t.slot);
  r.ring.hand_off(t.slot);
  r.queue_write(Job{t.slot, at, n, data});
  return true;
}

void check(const Source& s, WorkerPool& pool, int writers) {
  if (s.slot_count() == 0) throw InvalidArgument("save: the source has no staging slots");
  if (s.slot_bytes() == 0 || s.slot_bytes() % kAlign != 0)
    throw InvalidArgument("save: slot_bytes=" + std::to_string(s.slot_bytes()) + ": expected a positive multiple of " +
                          std::to_string(kAlign));
  if (writers < 1 || writers > pool.size())
    throw InvalidArgument("save: writers=" + std::to_string(writers) + ": expected 1.." + std::to_string(pool.size()) +
                          " (the pool's threads)");
}

}  // namespace

WriteStats run_write_pipeline(AtomicFile& file, uint64_t offset, uint64_t bytes, Source& source, WorkerPool& pool,
                              int writers) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  check(source, pool, writers);
  WriteStats st;
  if (bytes == 0) return st;
  WriteRun r(file, source);
  const uint64_t chunks = (bytes + source.slot_bytes() - 1) / source.slot_bytes();
  launch_writers(r, pool, static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(writers), chunks)));
  try {
    for (uint64_t at = 0; at < bytes && !r.stop;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(source.slot_bytes(), bytes - at));
      if (!fill_one(r, offset + at, n)) break;
      at += n;
    }
  } catch (...) {
    r.fail(std::current_exception());
  }
  r.close_and_wait();
  // Every writer has returned: no lock needed.
  if (r.error) {
    source.abort();
    std::rethrow_exception(r.error);
  }
  st.bytes = r.written;
  st.writes = r.writes;
  st.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return st;
}

}  // namespace ferry::load
