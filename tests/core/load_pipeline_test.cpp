// load_pipeline_test.cpp — the loader's threads with host memory as the
// destination (HostTarget), on real files: random files and ranges at odd
// offsets and sizes into poisoned buffers, with 1..8 readers, 1..8 slots,
// buffered / O_DIRECT / automatic reads. Errors: a file that shrank after it was
// opened (a short read), a read error (EBADF from a descriptor swapped under
// the FileSet), a missing file, a directory; each names the file and the
// range, and the same worker pool runs the next load. A file renamed over or
// changed while open: the stats' identities and changed say so.
#include "load/pipeline.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/worker_pool.h"
#include "load/host_target.h"
#include "../support/temp_files.h"

namespace ferry::load {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;

using Files = test_support::TempFiles;
using test_support::error_of;

struct Load {
  std::vector<FileRange> ranges;
  std::vector<uint8_t> expected, dst;
};

// Random ranges of the files, destinations packed into one poisoned buffer.
Load random_load(const Files& f, std::mt19937_64& rng, int count) {
  Load l;
  std::vector<std::pair<uint32_t, std::pair<uint64_t, uint64_t>>> picks;
  uint64_t total = 0;
  for (int k = 0; k < count; ++k) {
    uint32_t i = static_cast<uint32_t>(rng() % f.data.size());
    uint64_t size = f.data[i].size();
    uint64_t off = size ? rng() % size : 0;
    uint64_t n = size ? rng() % (size - off + 1) : 0;
    if (rng() % 4 == 0) off = 0, n = size;  // whole files too
    picks.push_back({i, {off, n}});
    total += n;
  }
  l.dst.assign(total + 1, 0xA5);
  uint64_t at = 0;
  for (auto& [i, r] : picks) {
    l.ranges.push_back({i, r.first, r.second, reinterpret_cast<uintptr_t>(l.dst.data()) + at});
    l.expected.insert(l.expected.end(), f.data[i].begin() + static_cast<ptrdiff_t>(r.first),
                      f.data[i].begin() + static_cast<ptrdiff_t>(r.first + r.second));
    at += r.second;
  }
  l.expected.push_back(0xA5);  // the byte past the end stays poisoned
  return l;
}

PipelineStats run(const Files& f, const Load& l, HostTarget& target, WorkerPool& pool, DirectIo direct,
                  int threads, uint64_t window) {
  FileSet files(f.paths, direct);
  ReadPlan plan = plan_reads(l.ranges, files.sizes(), files.names(), PlanOptions{window, 64 * KiB});
  PipelineOptions o;
  o.threads = threads;
  return run_pipeline(plan, files, target, pool, o);
}

TEST(LoadPipeline, RandomLoadsArriveIntact) {
  std::mt19937_64 rng(21);
  Files f;
  ASSERT_TRUE(f.ok());
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{3 * MiB + 17}, size_t{700 * KiB + 3}})
    f.add(bytes, rng);
  WorkerPool pool(9);
  struct Config {
    int threads, slots;
    uint64_t slot_bytes;
    DirectIo direct;
  } configs[] = {
      {1, 1, 64 * KiB, DirectIo::never},   {4, 2, 256 * KiB, DirectIo::never},  {8, 8, 1 * MiB, DirectIo::always},
      {3, 5, 128 * KiB, DirectIo::automatic}, {4, 4, 256 * KiB, DirectIo::never}, {2, 3, 64 * KiB, DirectIo::never},
      {8, 2, 512 * KiB, DirectIo::always},
  };
  for (const Config& c : configs) {
    for (int round = 0; round < 6; ++round) {
      HostTarget target(static_cast<size_t>(c.slots), c.slot_bytes);
      Load l = random_load(f, rng, 1 + static_cast<int>(rng() % 30));
      PipelineStats st = run(f, l, target, pool, c.direct, c.threads, c.slot_bytes);
      ASSERT_EQ(l.dst, l.expected) << "threads " << c.threads << " slots " << c.slots << " direct "
                                   << direct_io_name(c.direct);
      EXPECT_EQ(st.staged_bytes, st.read_bytes);
      if (c.direct == DirectIo::always) {
        EXPECT_EQ(st.direct_reads, st.reads);
      }
      if (c.direct == DirectIo::never) {
        EXPECT_EQ(st.direct_reads, 0u);
      }
    }
  }
}

TEST(LoadPipeline, AutomaticModeReadsCachedFilesThroughThePageCache) {
  std::mt19937_64 rng(9);
  Files f;
  ASSERT_TRUE(f.ok());
  f.add(2 * MiB, rng);  // just written: in the page cache
  FileSet files(f.paths, DirectIo::automatic);
  EXPECT_EQ(files[0].direct_fd, -1);
  EXPECT_GT(files[0].cached_share, 0.5);
}

TEST(LoadPipeline, ODirectRefusedByTheFileSystemFallsBackToBufferedReads) {
  struct stat st;
  if (stat("/dev/shm", &st) != 0) GTEST_SKIP() << "no /dev/shm (tmpfs) here";
  std::mt19937_64 rng(4);
  Files f("/dev/shm");
  if (!f.ok()) GTEST_SKIP() << "cannot create a directory in /dev/shm";
  f.add(300 * KiB + 5, rng);
  FileSet files(f.paths, DirectIo::always);
  if (files[0].direct_fd >= 0) GTEST_SKIP() << "this /dev/shm accepts O_DIRECT";
  ASSERT_EQ(files.notes().size(), 1u);
  EXPECT_NE(files.notes()[0].find("refuses O_DIRECT"), std::string::npos);
  WorkerPool pool(2);
  HostTarget target(2, 128 * KiB);
  Load l = random_load(f, rng, 10);
  PipelineStats s = run(f, l, target, pool, DirectIo::always, 2, 128 * KiB);
  EXPECT_EQ(l.dst, l.expected);
  EXPECT_EQ(s.direct_reads, 0u);
}

TEST(LoadPipeline, AShortReadFailsTheLoadNamingFileAndRange) {
  std::mt19937_64 rng(8);
  Files f;
  ASSERT_TRUE(f.ok());
  f.add(1 * MiB, rng);
  f.add(2 * MiB + 100, rng);
  WorkerPool pool(4);
  for (DirectIo direct : {DirectIo::never, DirectIo::always}) {
    HostTarget target(3, 256 * KiB);
    std::vector<uint8_t> dst(3 * MiB + 100);
    std::vector<FileRange> ranges{{0, 0, MiB, reinterpret_cast<uintptr_t>(dst.data())},
                                  {1, 0, 2 * MiB + 100, reinterpret_cast<uintptr_t>(dst.data()) + MiB}};
    FileSet files(f.paths, direct);
    ReadPlan plan = plan_reads(ranges, files.sizes(), files.names(), PlanOptions{256 * KiB, 64 * KiB});
    ASSERT_EQ(truncate(f.paths[1].c_str(), static_cast<off_t>(MiB + 10)), 0);  // shrinks after fstat
    PipelineOptions o;
    o.threads = 4;
    std::string msg = error_of([&] { run_pipeline(plan, files, target, pool, o); });
    EXPECT_NE(msg.find(f.paths[1] + ", bytes ["), std::string::npos) << msg;
    EXPECT_NE(msg.find("short read"), std::string::npos) << msg;
    // Restore the file: the pool runs the next load.
    std::ofstream(f.paths[1], std::ios::binary)
        .write(reinterpret_cast<const char*>(f.data[1].data()), static_cast<std::streamsize>(f.data[1].size()));
    FileSet again(f.paths, direct);
    std::fill(dst.begin(), dst.end(), 0);
    run_pipeline(plan, again, target, pool, o);
    EXPECT_TRUE(std::equal(f.data[0].begin(), f.data[0].end(), dst.begin()));
    EXPECT_TRUE(std::equal(f.data[1].begin(), f.data[1].end(), dst.begin() + MiB));
  }
}

// A file renamed over after its identity was taken (as load_safetensors' catalog
// takes it with the header) is another inode: the stats' identity says so, and
// the bytes read are the new file's whole (the descriptors never mix the two).
TEST(LoadPipeline, AFileRenamedOverBeforeTheOpenReportsTheNewIdentityAndReadsOnlyIt) {
  std::mt19937_64 rng(31);
  Files f;
  ASSERT_TRUE(f.ok());
  f.add(700 * KiB + 3, rng);
  f.add(700 * KiB + 3, rng);  // the replacement: same size, other bytes
  os::FileIdentity before;
  ASSERT_EQ(os::path_identity(f.paths[0].c_str(), &before), 0);
  ASSERT_EQ(rename(f.paths[1].c_str(), f.paths[0].c_str()), 0);
  WorkerPool pool(3);
  HostTarget target(2, 64 * KiB);
  std::vector<uint8_t> dst(700 * KiB + 3, 0xA5);
  std::vector<FileRange> ranges{{0, 0, dst.size(), reinterpret_cast<uintptr_t>(dst.data())}};
  std::vector<std::string> one{f.paths[0]};
  FileSet files(one, DirectIo::never);
  ReadPlan plan = plan_reads(ranges, files.sizes(), files.names(), PlanOptions{64 * KiB, 64 * KiB});
  PipelineOptions o;
  o.threads = 3;
  PipelineStats st = run_pipeline(plan, files, target, pool, o);
  ASSERT_EQ(st.identities.size(), 1u);
  EXPECT_NE(st.identities[0].inode, before.inode);
  EXPECT_TRUE(st.changed.empty());
  EXPECT_EQ(dst, f.data[1]);
}

// Written (same size, new modification time) or resized while it was open:
// changed names the file and what changed.
TEST(LoadPipeline, AFileChangedWhileOpenIsNamedInChanged) {
  std::mt19937_64 rng(33);
  for (int how = 0; how < 2; ++how) {
    Files f;
    ASSERT_TRUE(f.ok());
    f.add(300 * KiB + 11, rng);
    f.add(5000, rng);  // unchanged: not named
    WorkerPool pool(2);
    HostTarget target(2, 64 * KiB);
    std::vector<uint8_t> dst(5000, 0xA5);
    std::vector<FileRange> ranges{{1, 0, 5000, reinterpret_cast<uintptr_t>(dst.data())}};
    FileSet files(f.paths, DirectIo::never);
    ReadPlan plan = plan_reads(ranges, files.sizes(), files.names(), PlanOptions{64 * KiB, 64 * KiB});
    int fd = open(f.paths[0].c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    if (how == 0) {
      ASSERT_EQ(pwrite(fd, "x", 1, 100), 1);
      const timespec times[2] = {{0, UTIME_OMIT}, {12345, 678}};  // a modification time surely not the old one
      ASSERT_EQ(futimens(fd, times), 0);
    } else {
      ASSERT_EQ(ftruncate(fd, 1000), 0);
    }
    close(fd);
    PipelineOptions o;
    o.threads = 2;
    PipelineStats st = run_pipeline(plan, files, target, pool, o);
    ASSERT_EQ(st.changed.size(), 1u) << how;
    EXPECT_NE(st.changed[0].find(f.paths[0]), std::string::npos) << st.changed[0];
    EXPECT_NE(st.changed[0].find(how == 0 ? "written to while it was read" : "size went from 307211 to 1000"),
              std::string::npos)
        << st.changed[0];
    EXPECT_TRUE(std::equal(f.data[1].begin(), f.data[1].end(), dst.begin()));
  }
}

TEST(LoadPipeline, AReadErrorFailsTheLoadNamingFileAndRange) {
  std::mt19937_64 rng(10);
  Files f;
  ASSERT_TRUE(f.ok());
  f.add(600 * KiB, rng);
  WorkerPool pool(3);
  HostTarget target(2, 64 * KiB);
  std::vector<uint8_t> dst(600 * KiB);
  std::vector<FileRange> ranges{{0, 0, 600 * KiB, reinterpret_cast<uintptr_t>(dst.data())}};
  FileSet files(f.paths, DirectIo::never);
  ReadPlan plan = plan_reads(ranges, files.sizes(), files.names(), PlanOptions{64 * KiB, 64 * KiB});
  // A real failing pread: the FileSet's descriptor now refers to a file
  // opened write-only (EBADF on read).
  int wfd = open(f.paths[0].c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(wfd, 0);
  ASSERT_EQ(dup2(wfd, files[0].fd), files[0].fd);
  close(wfd);
  PipelineOptions o;
  o.threads = 3;
  std::string msg = error_of([&] { run_pipeline(plan, files, target, pool, o); });
  EXPECT_NE(msg.find("read of " + f.paths[0] + ", bytes ["), std::string::npos) << msg;
  EXPECT_NE(msg.find("errno 9"), std::string::npos) << msg;
}

TEST(LoadPipeline, OpeningRefusesMissingFilesAndDirectories) {
  Files f;
  ASSERT_TRUE(f.ok());
  std::mt19937_64 rng(1);
  f.add(10, rng);
  std::vector<std::string> missing{f.paths[0], f.paths[0] + ".nope"};
  std::string msg = error_of([&] { FileSet s(missing, DirectIo::never); });
  EXPECT_NE(msg.find("open '" + missing[1] + "' failed"), std::string::npos) << msg;
  std::string dir = f.paths[0].substr(0, f.paths[0].rfind('/'));
  std::vector<std::string> dirs{dir};
  msg = error_of([&] { FileSet s(dirs, DirectIo::never); });
  EXPECT_NE(msg.find(dir + ": not a regular file"), std::string::npos) << msg;
}

TEST(LoadPipeline, RefusesAPlanThatDoesNotFitTheSlots) {
  Files f;
  ASSERT_TRUE(f.ok());
  std::mt19937_64 rng(2);
  f.add(1 * MiB, rng);
  WorkerPool pool(1);
  HostTarget target(2, 64 * KiB);
  std::vector<uint8_t> dst(MiB);
  std::vector<FileRange> ranges{{0, 0, MiB, reinterpret_cast<uintptr_t>(dst.data())}};
  FileSet files(f.paths, DirectIo::never);
  ReadPlan plan = plan_reads(ranges, files.sizes(), files.names(), PlanOptions{1 * MiB, 64 * KiB});
  PipelineOptions o;
  std::string msg = error_of([&] { run_pipeline(plan, files, target, pool, o); });
  EXPECT_NE(msg.find("does not fit a 64 KiB staging slot"), std::string::npos) << msg;
  o.threads = 0;
  plan = plan_reads(ranges, files.sizes(), files.names(), PlanOptions{64 * KiB, 64 * KiB});
  msg = error_of([&] { run_pipeline(plan, files, target, pool, o); });
  EXPECT_NE(msg.find("threads=0"), std::string::npos) << msg;
  EXPECT_EQ(parse_direct_io("auto"), DirectIo::automatic);
  EXPECT_THROW(parse_direct_io("sometimes"), InvalidArgument);
}

}  // namespace
}  // namespace ferry::load
