// write_pipeline_test.cpp — save's threads (load/write_pipeline.h) into an
// AtomicFile (load/atomic_file.h) on real files in a temporary directory:
// random bytes of odd sizes (not slot multiples) through 1..8 slots and 1..4
// writers, buffered and O_DIRECT, at file offset 0 and at an offset; slots
// refilled many times arrive intact (a slot refilled before its write landed
// would tear the file). Errors: a Source that throws mid-file, a write error
// (EFBIG past RLIMIT_FSIZE), each stopping the run with the range named;
// O_DIRECT writes the file system refuses (EINVAL) fall back to the file's
// buffered descriptor. LayoutSource (load/layout_source.h): header and host
// parts of odd sizes, zero-size parts, aligned views.
#include "load/write_pipeline.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include <sys/resource.h>

#include <csignal>

#include "core/error.h"
#include "core/worker_pool.h"
#include "load/atomic_file.h"
#include "load/layout_source.h"
#include "os/file.h"
#include "../support/temp_files.h"

namespace ferry::load {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB, kAlign = os::kDirectIoAlignment;

using Files = test_support::TempFiles;

std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> d(n);
  for (auto& b : d) b = static_cast<uint8_t>(rng());
  return d;
}

// Slots of aligned memory filled from `bytes` (the file's range); records the
// fills and can throw at one of them.
class VectorSource final : public Source {
 public:
  VectorSource(const std::vector<uint8_t>& bytes, uint64_t file_offset, size_t slots, size_t slot_bytes)
      : bytes_(bytes), offset_(file_offset), slot_bytes_(slot_bytes) {
    for (size_t i = 0; i < slots; ++i) {
      // aligned_alloc wants a multiple of the alignment (a slot of an odd size is a test case)
      const size_t room = (slot_bytes + kAlign - 1) / kAlign * kAlign;
      auto* p = static_cast<unsigned char*>(std::aligned_alloc(kAlign, room));
      std::memset(p, 0xA5, room);
      slots_.push_back(p);
    }
  }
  ~VectorSource() override {
    for (auto* p : slots_) std::free(p);
  }
  size_t slot_count() const override { return slots_.size(); }
  size_t slot_bytes() const override { return slot_bytes_; }
  const unsigned char* slot(size_t i) const override { return slots_[i]; }
  void fill(size_t i, uint64_t file_offset, size_t n) override {
    EXPECT_EQ(file_offset, next_) << "fills come in file order, back to back";
    EXPECT_LE(n, slot_bytes_);
    if (fills == throw_at) throw InvalidArgument("test source: fill " + std::to_string(fills) + " refused");
    ++fills;
    next_ = file_offset + n;
    std::memcpy(slots_[i], bytes_.data() + (file_offset - offset_), n);
  }
  void abort() noexcept override { aborted = true; }

  int fills = 0;
  int throw_at = -1;
  bool aborted = false;

 private:
  const std::vector<uint8_t>& bytes_;
  uint64_t offset_;
  uint64_t next_ = offset_;
  size_t slot_bytes_;
  std::vector<unsigned char*> slots_;
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Written {
  WriteStats stats;
  std::vector<uint8_t> file;
  bool direct = false;
};

// Writes `bytes` at `offset` of a new AtomicFile, finishes and publishes it
// and reads it back.
Written write(const Files& dir, const std::string& name, const std::vector<uint8_t>& bytes, uint64_t offset,
              size_t slots, size_t slot_bytes, int writers, bool direct, WorkerPool& pool) {
  Written w;
  const std::string path = dir.dir() + "/" + name;
  AtomicFile f(path, path + ".tmp", direct, false);
  VectorSource src(bytes, offset, slots, slot_bytes);
  w.stats = run_write_pipeline(f, offset, bytes.size(), src, pool, writers);
  w.direct = f.direct();
  f.finish(offset + bytes.size(), {});
  f.publish(false);
  w.file = read_file(path);
  std::remove(path.c_str());
  EXPECT_EQ(src.fills, static_cast<int>((bytes.size() + slot_bytes - 1) / slot_bytes));
  return w;
}

TEST(WritePipeline, RandomBytesArriveIntact) {
  std::mt19937_64 rng(32);
  Files dir;
  ASSERT_TRUE(dir.ok());
  WorkerPool pool(4);
  struct Config {
    size_t slots, slot_bytes;
    int writers;
  };
  const Config configs[] = {{1, 4 * KiB, 1}, {1, 64 * KiB, 4}, {2, 4 * KiB, 4}, {3, 12 * KiB, 2},
                            {8, 64 * KiB, 4}, {8, 1 * MiB, 3}};
  int k = 0;
  for (size_t n : {size_t{1}, size_t{4095}, size_t{4097}, size_t{700 * KiB + 3}, size_t{3 * MiB + 17}}) {
    const std::vector<uint8_t> bytes = random_bytes(n, rng);
    for (const Config& c : configs)
      for (bool direct : {false, true}) {
        SCOPED_TRACE("bytes " + std::to_string(n) + ", " + std::to_string(c.slots) + " x " +
                     std::to_string(c.slot_bytes) + ", writers " + std::to_string(c.writers) +
                     (direct ? ", O_DIRECT" : ", buffered"));
        Written w = write(dir, "f" + std::to_string(k++), bytes, 0, c.slots, c.slot_bytes, c.writers, direct, pool);
        EXPECT_EQ(w.file, bytes);
        EXPECT_EQ(w.stats.bytes, n);
        EXPECT_EQ(w.stats.writes, (n + c.slot_bytes - 1) / c.slot_bytes);
      }
  }
}

TEST(WritePipeline, ARangeAtAnOffsetLeavesTheBytesBeforeIt) {
  std::mt19937_64 rng(7);
  Files dir;
  ASSERT_TRUE(dir.ok());
  WorkerPool pool(3);
  const std::vector<uint8_t> bytes = random_bytes(1 * MiB + 333, rng);
  Written w = write(dir, "at", bytes, 64 * KiB, 4, 16 * KiB, 3, false, pool);
  ASSERT_EQ(w.file.size(), 64 * KiB + bytes.size());
  EXPECT_EQ(std::vector<uint8_t>(w.file.begin(), w.file.begin() + 64 * KiB), std::vector<uint8_t>(64 * KiB, 0));
  EXPECT_EQ(std::vector<uint8_t>(w.file.begin() + 64 * KiB, w.file.end()), bytes);
}

TEST(WritePipeline, ODirectWritesTheFileSystemRefusesFallBackToBufferedWrites) {
  // A range at offset 8 (after an 8-byte header): no file system takes
  // O_DIRECT writes there (EINVAL), whatever it does with aligned ones.
  std::mt19937_64 rng(9);
  Files dir;
  ASSERT_TRUE(dir.ok());
  WorkerPool pool(4);
  const std::vector<uint8_t> bytes = random_bytes(2 * MiB + 77, rng);
  const std::string path = dir.dir() + "/fallback";
  AtomicFile f(path, path + ".tmp", true, false);
  if (!f.direct()) GTEST_SKIP() << "this file system refuses O_DIRECT at open (the file is then buffered)";
  f.write("8 bytes!", 8, 0);  // unaligned: the fallback already
  EXPECT_FALSE(f.direct());
  VectorSource src(bytes, 8, 4, 64 * KiB);
  WriteStats st = run_write_pipeline(f, 8, bytes.size(), src, pool, 4);
  EXPECT_EQ(st.writes, (bytes.size() + 64 * KiB - 1) / (64 * KiB));
  ASSERT_EQ(f.notes().size(), 1u);
  EXPECT_NE(f.notes()[0].find("EINVAL"), std::string::npos) << f.notes()[0];
  EXPECT_EQ(::fcntl(f.fd(), F_GETFL) & O_DIRECT, 0);
  f.finish(8 + bytes.size(), {});
  f.publish(false);
  std::vector<uint8_t> file = read_file(path);
  std::remove(path.c_str());
  ASSERT_EQ(file.size(), 8 + bytes.size());
  EXPECT_EQ(std::string(file.begin(), file.begin() + 8), "8 bytes!");
  EXPECT_EQ(std::vector<uint8_t>(file.begin() + 8, file.end()), bytes);
}

TEST(WritePipeline, ASourceThatThrowsMidFileStopsTheRunNamingTheRange) {
  std::mt19937_64 rng(5);
  Files dir;
  ASSERT_TRUE(dir.ok());
  WorkerPool pool(4);
  const std::vector<uint8_t> bytes = random_bytes(1 * MiB + 5, rng);
  for (size_t slots : {size_t{1}, size_t{2}, size_t{8}}) {
    const std::string path = dir.dir() + "/throws.safetensors";
    VectorSource src(bytes, 0, slots, 16 * KiB);
    src.throw_at = 5;
    std::string what;
    {
      AtomicFile f(path, path + ".tmp", false, false);
      try {
        run_write_pipeline(f, 0, bytes.size(), src, pool, 4);
      } catch (const Error& e) {  // the Source's error, its status kept, the range added
        EXPECT_EQ(e.status(), FERRY_ERROR_INVALID_ARGUMENT);
        what = e.what();
      }
    }  // not published: the temporary file is removed
    EXPECT_NE(what.find("throws.safetensors, bytes [81920, 98304): test source: fill 5 refused"), std::string::npos)
        << what;
    EXPECT_EQ(src.fills, 5) << "no fill after the failure";
    EXPECT_TRUE(src.aborted);
    EXPECT_TRUE(read_file(path + ".tmp").empty());
  }
  // The same pool runs the next save.
  Written w = write(dir, "after", bytes, 0, 2, 16 * KiB, 4, false, pool);
  EXPECT_EQ(w.file, bytes);
}

TEST(WritePipeline, AWriteErrorStopsTheRunWithItsErrno) {
  // A real write error: past RLIMIT_FSIZE, pwrite gives EFBIG (SIGXFSZ ignored).
  std::mt19937_64 rng(6);
  Files dir;
  ASSERT_TRUE(dir.ok());
  WorkerPool pool(4);
  const std::vector<uint8_t> bytes = random_bytes(4 * MiB + 9, rng);
  const std::string path = dir.dir() + "/limited.safetensors";
  VectorSource src(bytes, 0, 2, 4 * KiB);
  int err = 0;
  std::string what;
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  {
    AtomicFile f(path, path + ".tmp", false, false);
    struct rlimit small = old;
    small.rlim_cur = 1 * MiB;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    try {
      run_write_pipeline(f, 0, bytes.size(), src, pool, 4);
    } catch (const OsError& e) {
      err = e.error_number();
      what = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
  }
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(err, EFBIG) << what;
  EXPECT_NE(what.find("pwrite of " + path + ", bytes ["), std::string::npos) << what;
  EXPECT_LT(src.fills, 1024) << "the caller stopped filling (of " << bytes.size() / (4 * KiB) + 1 << " slots)";
  EXPECT_TRUE(src.aborted);
  EXPECT_TRUE(read_file(path + ".tmp").empty()) << "the temporary file is removed";
}

TEST(WritePipeline, BadArgumentsAreRefusedBeforeAnythingIsWritten) {
  std::mt19937_64 rng(1);
  Files dir;
  ASSERT_TRUE(dir.ok());
  WorkerPool pool(2);
  const std::vector<uint8_t> bytes = random_bytes(10000, rng);
  const std::string path = dir.dir() + "/bad";
  AtomicFile f(path, path + ".tmp", false, false);
  VectorSource odd(bytes, 0, 2, 4 * KiB + 512), ok(bytes, 0, 2, 4 * KiB);
  const std::string odd_error = test_support::error_of([&] { run_write_pipeline(f, 0, bytes.size(), odd, pool, 2); });
  EXPECT_NE(odd_error.find("slot_bytes=4608"), std::string::npos) << odd_error;
  EXPECT_NE(test_support::error_of([&] { run_write_pipeline(f, 0, bytes.size(), ok, pool, 3); }).find("writers=3"),
            std::string::npos);
  EXPECT_EQ(odd.fills + ok.fills, 0);
  EXPECT_TRUE(read_file(path + ".tmp").empty());
}

// LayoutSource: a header and host parts of odd sizes (zero-size ones among
// them) through small slots; a part whose memory is 4 KiB aligned at a slot's
// start is viewed, not copied.
TEST(LayoutSource, HeaderAndHostPartsArriveIntactAndAlignedSlotsAreViewed) {
  std::mt19937_64 rng(11);
  Files dir;
  ASSERT_TRUE(dir.ok());
  WorkerPool pool(4);
  FileLayout layout;
  layout.header = std::string(4 * KiB, ' ');
  for (auto& c : layout.header) c = static_cast<char>(rng());
  std::vector<std::vector<uint8_t>> owned;
  std::vector<uint8_t> expect(layout.header.begin(), layout.header.end());
  // Parts placed so that no slot start falls on a 4 KiB boundary of their
  // memory (address - file offset = 1 mod 4096): copied, never viewed.
  auto add_unaligned = [&](size_t n) {
    owned.emplace_back(n + kAlign);
    const uintptr_t base = reinterpret_cast<uintptr_t>(owned.back().data());
    const uintptr_t want = (expect.size() + 1) % kAlign;
    const uintptr_t at = base + (want + kAlign - base % kAlign) % kAlign;
    auto* p = reinterpret_cast<uint8_t*>(at);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
    layout.parts.push_back(FilePart{at, n, -1});
    expect.insert(expect.end(), p, p + n);
  };
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{0}, size_t{70001}, size_t{3}}) add_unaligned(n);
  // An aligned part of 64 KiB, starting on a 4 KiB boundary of the file.
  add_unaligned((kAlign - expect.size() % kAlign) % kAlign);
  auto* aligned = static_cast<unsigned char*>(std::aligned_alloc(kAlign, 64 * KiB));
  for (size_t i = 0; i < 64 * KiB; ++i) aligned[i] = static_cast<unsigned char>(rng());
  layout.parts.push_back(FilePart{reinterpret_cast<uintptr_t>(aligned), 64 * KiB, -1});
  expect.insert(expect.end(), aligned, aligned + 64 * KiB);
  ASSERT_EQ(layout.total(), expect.size());
  for (bool direct : {false, true}) {
    std::vector<unsigned char*> slots;
    for (int i = 0; i < 3; ++i) slots.push_back(static_cast<unsigned char*>(std::aligned_alloc(kAlign, 4 * KiB)));
    LayoutSource src(layout, slots, 4 * KiB, nullptr);
    const std::string path = dir.dir() + "/layout";
    AtomicFile f(path, path + ".tmp", direct, false);
    run_write_pipeline(f, 0, layout.total(), src, pool, 3);
    f.finish(layout.total(), {});
    f.publish(false);
    EXPECT_EQ(read_file(path), expect);
    EXPECT_EQ(src.copied_bytes(), layout.total() - layout.header.size() - 64 * KiB) << "the aligned part is viewed";
    for (auto* p : slots) std::free(p);
    std::remove(path.c_str());
  }
  std::free(aligned);
}

TEST(LayoutSource, ADevicePartWithoutDeviceReadsIsRefused) {
  FileLayout layout;
  layout.parts.push_back(FilePart{0x1000, 10, 0});
  std::vector<unsigned char*> slots{nullptr};
  EXPECT_NE(test_support::error_of([&] { LayoutSource(layout, slots, 4 * KiB, nullptr); }).find("cuda:0"),
            std::string::npos);
}

}  // namespace
}  // namespace ferry::load
