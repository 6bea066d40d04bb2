// pipeline.cpp — FileSet (opening, cache probes, O_DIRECT fallback) and the
// workers of run_pipeline: readers, the waiting thread's progress line.
#include "load/pipeline.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>

#include "core/error.h"
#include "core/slot_ring.h"
#include "core/worker_pool.h"
#include "os/file.h"
#include "os/memory.h"

namespace ferry::load {
namespace {

constexpr uint64_t kAlign = os::kDirectIoAlignment;
uint64_t align_down(uint64_t v) { return v & ~(kAlign - 1); }
uint64_t align_up(uint64_t v) { return (v + kAlign - 1) & ~(kAlign - 1); }

std::string range_of(const FileSet::File& f, uint64_t offset, uint64_t bytes) {
  return f.name + ", bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) + ")";
}

// The state of one run_pipeline call, shared by its workers.
//
// Locking: mu guards next_read, error, running and notes. stop is atomic so
// that workers can look at it without the lock. The slots' states and order
// are the ring's (core/slot_ring.h, its own lock). No system call and no
// Target call is made while mu is held.
struct Run {
  Run(const ReadPlan& p, const FileSet& f, Target& t, const PipelineOptions& o)
      : plan(p), files(f), target(t), opt(o), ring(t.slot_count()), direct_refused(f.size()) {}

  const ReadPlan& plan;
  const FileSet& files;
  Target& target;
  const PipelineOptions& opt;

  SlotRing ring;  // the Target's slots: landing = Target::wait_slot_free
  std::mutex mu;
  std::condition_variable end_cv;    // a worker ended (the load's thread waits on it)
  size_t next_read = 0;              // guarded by mu; readers' cursor into plan.reads
  std::exception_ptr error;          // guarded by mu; the first failure
  int running = 0;                   // guarded by mu; workers not yet returned
  std::vector<std::string> notes;    // guarded by mu
  std::atomic<bool> stop{false};

  std::vector<std::atomic<bool>> direct_refused;  // per file: O_DIRECT read gave EINVAL once
  std::atomic<uint64_t> done_bytes{0}, staged_bytes{0}, direct_reads{0};

  void note(std::string text) {
    std::lock_guard<std::mutex> lock(mu);
    notes.push_back(std::move(text));
  }
  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = e;
      stop = true;
    }
    ring.stop();
  }
  // A worker's last touch of the Run: notified under the lock, so that the
  // load's thread (which may destroy the Run once running is 0) cannot run
  // before the notification is done.
  void worker_ended() {
    std::lock_guard<std::mutex> lock(mu);
    --running;
    end_cv.notify_all();
  }
  // The next read for the readers; SIZE_MAX when none is left or stopping.
  size_t next_staged_read() {
    std::lock_guard<std::mutex> lock(mu);
    if (stop || next_read >= plan.reads.size()) return SIZE_MAX;
    return next_read++;
  }
};

// Runs a Target call; its error gains the file and range it was for.
template <class F>
void for_range(const FileSet::File& f, const PlannedRead& rd, F&& body) {
  try {
    body();
  } catch (const Error& e) {
    throw Error(e.status(), range_of(f, rd.offset, rd.bytes) + ": " + e.what());
  }
}

[[noreturn]] void short_read(const FileSet::File& f, uint64_t offset, uint64_t bytes, uint64_t got) {
  throw InvalidArgument(range_of(f, offset, bytes) + ": short read: the file ended after " + std::to_string(got) +
                        " of these bytes (it has " + std::to_string(f.bytes) +
                        " bytes by fstat; did it shrink during the load?)");
}

// Reads plan read i into slot s; returns the offset of the read's first byte
// in the slot (O_DIRECT reads start at the aligned offset below it).
size_t read_into_slot(Run& r, const PlannedRead& rd, unsigned char* buf) {
  const FileSet::File& f = r.files[rd.file];
  size_t got = 0;
  if (f.direct_fd >= 0 && !r.direct_refused[rd.file]) {
    const uint64_t a0 = align_down(rd.offset), a1 = align_up(rd.offset + rd.bytes);
    int err = os::read_at(f.direct_fd, buf, a1 - a0, a0, &got);
    if (err == 0) {
      const uint64_t head = rd.offset - a0;
      if (got < head + rd.bytes) short_read(f, rd.offset, rd.bytes, got > head ? got - head : 0);
      ++r.direct_reads;
      return head;
    }
    if (err != EINVAL) throw OsError("O_DIRECT read of " + range_of(f, a0, a1 - a0), err);
    if (!r.direct_refused[rd.file].exchange(true))
      r.note(f.name + ": an O_DIRECT read gave EINVAL (alignment the file system does not accept); "
             "buffered reads from here on");
  }
  int err = os::read_at(f.fd, buf, rd.bytes, rd.offset, &got);
  if (err) throw OsError("read of " + range_of(f, rd.offset, rd.bytes), err);
  if (got < rd.bytes) short_read(f, rd.offset, rd.bytes, got);
  return 0;
}

// One staged read: a slot, the read, its copies. False when the run stops.
bool staged_read(Run& r, size_t i) {
  const SlotRing::Taken taken = r.ring.take();
  const size_t s = taken.slot;
  if (s == SlotRing::kStopped) return false;
  try {
    const PlannedRead& rd = r.plan.reads[i];
    const FileSet::File& f = r.files[rd.file];
    // Always asked, not only when taken.landing_pending: a slot may still carry an
    // earlier run's copies (the Target's slots outlive a run), and the GPU target
    // also makes its device current for this thread there.
    for_range(f, rd, [&] { r.target.wait_slot_free(s); });
    unsigned char* buf = r.target.slot(s);
    const size_t head = read_into_slot(r, rd, buf);
    for_range(f, rd, [&] {
      for (size_t c = rd.first_copy; c < rd.first_copy + rd.copy_count; ++c) {
        const PlannedCopy& cp = r.plan.copies[c];
        r.target.copy_out(s, buf + head + cp.at, cp.dst, cp.bytes);
      }
      r.target.slot_filled(s);
    });
    r.staged_bytes += rd.bytes;
    r.done_bytes += rd.bytes;
  } catch (...) {
    r.ring.hand_off(s);  // copies may be enqueued from it: the next taker waits for them
    throw;
  }
  r.ring.hand_off(s);
  return true;
}

void reader(Run& r) {
  for (size_t i; (i = r.next_staged_read()) != SIZE_MAX;)
    if (!staged_read(r, i)) return;
}

void check_fits(const Run& r) {
  for (const PlannedRead& rd : r.plan.reads) {
    if (rd.file >= r.files.size())
      throw InvalidArgument("load: a read names file " + std::to_string(rd.file) + " of " +
                            std::to_string(r.files.size()));
    if (align_up(rd.offset + rd.bytes) - align_down(rd.offset) > r.target.slot_bytes())
      throw InvalidArgument("load: a read of " + std::to_string(rd.bytes) + " bytes does not fit a " +
                            format_bytes(r.target.slot_bytes()) + " staging slot (plan window too large)");
  }
  if (r.opt.threads < 1) throw InvalidArgument("load: threads=" + std::to_string(r.opt.threads) + ": expected >= 1");
}

class ProgressLine {
 public:
  ProgressLine(bool enabled, double after_s, uint64_t total) : enabled_(enabled), after_s_(after_s), total_(total) {}
  void update(double elapsed_s, uint64_t done) {
    if (!enabled_ || elapsed_s < after_s_) return;
    std::fprintf(stderr, "\rferry: loading %.2f of %.2f GB (%3.0f%%), %.1f GB/s   ", done / 1e9, total_ / 1e9,
                 total_ ? 100.0 * done / total_ : 100.0, elapsed_s > 0 ? done / elapsed_s / 1e9 : 0.0);
    std::fflush(stderr);
    shown_ = true;
  }
  void end(double elapsed_s, uint64_t done, bool ok) {
    if (!shown_) return;
    std::fprintf(stderr, "\rferry: %s %.2f GB in %.1f s, %.1f GB/s          \n", ok ? "loaded" : "load failed after",
                 done / 1e9, elapsed_s, elapsed_s > 0 ? done / elapsed_s / 1e9 : 0.0);
  }

 private:
  bool enabled_;
  double after_s_;
  uint64_t total_;
  bool shown_ = false;
};

}  // namespace

namespace {

// The share of kCacheProbes pages spread over the file found in the page
// cache; -1 when the file system cannot say (no RWF_NOWAIT).
double cached_share(int fd, uint64_t bytes) {
  int hits = 0;
  for (int k = 0; k < FileSet::kCacheProbes; ++k) {
    bool cached = false;
    if (os::is_cached(fd, bytes * static_cast<uint64_t>(k) / FileSet::kCacheProbes, &cached) != 0) return -1;
    hits += cached;
  }
  return static_cast<double>(hits) / FileSet::kCacheProbes;
}

}  // namespace

const char* direct_io_name(DirectIo d) noexcept {
  switch (d) {
    case DirectIo::automatic: return "auto";
    case DirectIo::never: return "never";
    case DirectIo::always: return "always";
  }
  return "?";
}

DirectIo parse_direct_io(const std::string& text) {
  if (text == "auto") return DirectIo::automatic;
  if (text == "never") return DirectIo::never;
  if (text == "always") return DirectIo::always;
  throw InvalidArgument("direct_io='" + text + "': expected auto, never or always");
}

FileSet::FileSet(std::span<const std::string> paths, DirectIo direct) {
  files_.reserve(paths.size());
  try {
    for (const std::string& p : paths) open_one(p, direct);
  } catch (...) {
    close_all();
    throw;
  }
}

FileSet::~FileSet() { close_all(); }

void FileSet::close_all() noexcept {
  for (File& f : files_) {
    if (f.direct_fd >= 0) os::close_fd(f.direct_fd);
    if (f.fd >= 0) os::close_fd(f.fd);
    f = File{};
  }
  files_.clear();
}

void FileSet::open_one(const std::string& path, DirectIo direct) {
  files_.push_back(File{});
  File& f = files_.back();
  f.name = path;
  if (int err = os::open_for_reading(path.c_str(), false, &f.fd)) throw OsError("open '" + path + "'", err);
  if (int err = os::regular_file_size(f.fd, &f.bytes)) {
    if (err == EISDIR || err == EINVAL) throw InvalidArgument(path + ": not a regular file");
    throw OsError("fstat '" + path + "'", err);
  }
  if (int err = os::file_identity(f.fd, &f.identity)) throw OsError("fstat '" + path + "'", err);
  bool use_direct = direct == DirectIo::always;
  if (direct == DirectIo::automatic && f.bytes > 0) {
    f.cached_share = cached_share(f.fd, f.bytes);
    use_direct = f.cached_share >= 0 && f.cached_share < 0.5;  // unknown (-1): buffered
  }
  if (use_direct) {
    int err = os::open_for_reading(path.c_str(), true, &f.direct_fd);
    if (err == EINVAL)
      notes_.push_back(path + ": the file system refuses O_DIRECT; buffered reads");
    else if (err)
      throw OsError("open '" + path + "' (O_DIRECT)", err);
  }
  if (f.direct_fd < 0) os::advise_sequential_reads(f.fd);  // read-ahead for an uncached file; harmless otherwise
}

std::vector<double> page_cache_shares(std::span<const std::string> paths) {
  std::vector<double> shares;
  shares.reserve(paths.size());
  for (const std::string& path : paths) {
    int fd = -1;
    if (int err = os::open_for_reading(path.c_str(), false, &fd)) throw OsError("open '" + path + "'", err);
    uint64_t bytes = 0;
    const int err = os::regular_file_size(fd, &bytes);
    const double share = err == 0 ? (bytes > 0 ? cached_share(fd, bytes) : 1.0) : 0.0;
    os::close_fd(fd);
    if (err == EISDIR || err == EINVAL) throw InvalidArgument(path + ": not a regular file");
    if (err) throw OsError("fstat '" + path + "'", err);
    shares.push_back(share);
  }
  return shares;
}

std::vector<std::string> FileSet::changed_since_open() const {
  std::vector<std::string> out;
  for (const File& f : files_) {
    os::FileIdentity now;
    if (os::file_identity(f.fd, &now) != 0) {
      out.push_back(f.name + ": fstat failed after the reads");
    } else if (now.size != f.identity.size) {
      out.push_back(f.name + ": its size went from " + std::to_string(f.identity.size) + " to " +
                    std::to_string(now.size) + " bytes while it was read");
    } else if (now.mtime_ns != f.identity.mtime_ns) {
      out.push_back(f.name + ": it was written to while it was read (modification time changed)");
    }
  }
  return out;
}

std::vector<uint64_t> FileSet::sizes() const {
  std::vector<uint64_t> v;
  for (const File& f : files_) v.push_back(f.bytes);
  return v;
}

std::vector<std::string> FileSet::names() const {
  std::vector<std::string> v;
  for (const File& f : files_) v.push_back(f.name);
  return v;
}

namespace {

// Starts `readers` readers on `pool`.
void launch_workers(Run& r, WorkerPool& pool, int readers) {
  auto launch = [&](void (*body)(Run&)) {
    {
      std::lock_guard<std::mutex> lock(r.mu);
      ++r.running;
    }
    try {
      pool.submit([&r, body] {
        try {
          body(r);
        } catch (...) {
          r.fail(std::current_exception());
        }
        r.worker_ended();
      });
    } catch (...) {  // no memory for the task: stop the others
      r.fail(std::current_exception());
      r.worker_ended();
    }
  };
  for (int k = 0; k < readers; ++k) launch(reader);
}

// Blocks until every worker returned, updating the progress line meanwhile.
template <class Elapsed>
void wait_for_workers(Run& r, ProgressLine& progress, Elapsed elapsed) {
  std::unique_lock<std::mutex> lock(r.mu);
  while (r.running > 0) {
    r.end_cv.wait_for(lock, std::chrono::milliseconds(250));
    lock.unlock();
    progress.update(elapsed(), r.done_bytes);
    lock.lock();
  }
}

}  // namespace

PipelineStats run_pipeline(const ReadPlan& plan, const FileSet& files, Target& target, WorkerPool& pool,
                           const PipelineOptions& options) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - start).count(); };
  if (target.slot_count() == 0) throw InvalidArgument("load: the target has no staging slots");
  Run r(plan, files, target, options);
  check_fits(r);
  launch_workers(r, pool, std::max(1, std::min<int>(options.threads, static_cast<int>(plan.reads.size()))));
  ProgressLine progress(options.progress, options.progress_after_s, plan.read_bytes);
  wait_for_workers(r, progress, elapsed);
  if (r.error) {  // every worker has returned: no lock needed
    target.abort();
    progress.end(elapsed(), r.done_bytes, false);
    std::rethrow_exception(r.error);
  }
  target.finish();
  PipelineStats st;
  st.range_bytes = plan.range_bytes;
  st.read_bytes = plan.read_bytes;
  st.staged_bytes = r.staged_bytes;
  st.reads = plan.reads.size();
  st.direct_reads = r.direct_reads;
  st.seconds = elapsed();
  st.notes = files.notes();
  st.notes.insert(st.notes.end(), r.notes.begin(), r.notes.end());
  for (size_t i = 0; i < files.size(); ++i) st.identities.push_back(files[i].identity);
  st.changed = files.changed_since_open();
  progress.end(st.seconds, r.done_bytes, true);
  return st;
}

}  // namespace ferry::load
