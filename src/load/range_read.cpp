// range_read.cpp — a file range read by several threads (range_read.h).
#include "load/range_read.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "os/file.h"

namespace ferry::load {
namespace {

constexpr size_t kMinChunk = size_t{1} << 20;
constexpr size_t kMaxChunk = size_t{32} << 20;  // Python's node reads used 32 MiB chunks
constexpr size_t kAlign = 4096;

struct Reads {
  int fd;
  const std::string& name;
  uint64_t offset;
  unsigned char* destination;
  size_t bytes;
  size_t chunk;
  std::atomic<size_t> next{0};          // the next chunk to take
  std::atomic<uint64_t> end{UINT64_MAX};  // smallest file end seen (a chunk read short)
  std::atomic<bool> failed{false};
  std::mutex mu;                        // guards error
  std::exception_ptr error{};

  void run() noexcept {
    const size_t chunks = (bytes + chunk - 1) / chunk;
    for (size_t k; !failed.load(std::memory_order_relaxed) && (k = next.fetch_add(1)) < chunks;) {
      const size_t lo = k * chunk, n = std::min(chunk, bytes - lo);
      size_t got = 0;
      if (const int err = os::read_at(fd, destination + lo, n, offset + lo, &got)) {
        fail(err, offset + lo);
        return;
      }
      if (got < n) {  // the file ends here: later chunks read nothing
        uint64_t seen = end.load();
        while (offset + lo + got < seen && !end.compare_exchange_weak(seen, offset + lo + got)) {
        }
      }
    }
  }

  void fail(int err, uint64_t at) noexcept {
    failed = true;
    std::lock_guard<std::mutex> lock(mu);
    if (error) return;
    try {
      error = std::make_exception_ptr(
          OsError("pread of " + name + " at byte " + std::to_string(at), err));
    } catch (...) {
      error = std::current_exception();  // bad_alloc: still an error to report
    }
  }
};

}  // namespace

size_t read_range(int fd, const std::string& name, uint64_t offset, void* destination, size_t bytes, int threads) {
  if (threads < 1 || threads > kMaxRangeReadThreads)
    throw InvalidArgument("threads=" + std::to_string(threads) + ": expected 1 .. " +
                          std::to_string(kMaxRangeReadThreads));
  if (bytes == 0) return 0;
  if (offset > UINT64_MAX - bytes)
    throw InvalidArgument(name + ": the range at byte " + std::to_string(offset) + " of " + std::to_string(bytes) +
                          " bytes passes the largest file offset");
  const size_t per_thread = (bytes + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  const size_t chunk = std::clamp((per_thread + kAlign - 1) / kAlign * kAlign, kMinChunk, kMaxChunk);
  Reads r{fd, name, offset, static_cast<unsigned char*>(destination), bytes, chunk, {0}, {UINT64_MAX}, {false}, {}, {}};
  const size_t helpers = std::min<size_t>(static_cast<size_t>(threads), (bytes + chunk - 1) / chunk) - 1;
  std::vector<std::thread> crew;
  crew.reserve(helpers);
  try {
    for (size_t i = 0; i < helpers; ++i) crew.emplace_back([&r] { r.run(); });
  } catch (...) {  // no thread to start: the ones started and this one read it all
  }
  r.run();
  for (std::thread& t : crew) t.join();
  if (r.error) std::rethrow_exception(r.error);
  const uint64_t end = r.end.load();
  return end == UINT64_MAX ? bytes : static_cast<size_t>(std::max<uint64_t>(end, offset) - offset);
}

}  // namespace ferry::load
