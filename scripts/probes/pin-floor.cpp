// pin-floor.cpp — how fast can this machine make N bytes of fresh host memory
// pinned (one cudaHostRegister over all of it) and usable? Standalone probe:
//   nvcc -O2 -std=c++17 -o pin-floor scripts/probes/pin-floor.cpp -lpthread
//   ./pin-floor [--bytes 8G] [--sweep-bytes 2G] [--threads 1,4,8,16] [--repeats 3] [--json FILE]
//
// It measures, each case on a fresh mapping (mmap, advice, touch, register,
// unregister, munmap), by page kind (4k = MADV_NOHUGEPAGE, thp = MADV_HUGEPAGE,
// hugetlb = MAP_HUGETLB 2 MiB, when enough pages are free):
//   touch      first-touch rate by thread count (threads claim 2 MiB units
//              front to back from one cursor, as ferry's FirstTouch does)
//   register   cudaHostRegister rate of touched and of untouched memory
//   seq        touch with all threads, then register: the plain floor
//   overlap    register on the main thread once `lead` bytes are touched,
//              while T threads touch the rest (leads 0, 64M, 512M, 2G; T = all
//              cores and all but one): what ferry's pool does
//   halves     the touched range registered as 2 or 4 pieces from 2 or 4
//              threads at once (does the driver register in parallel?)
//   split      register the first half while the second half is touched, then
//              the second half (two registrations: what "extending" a
//              registration could at best give)
//   populate   MAP_POPULATE (the kernel touches on one thread), then register
//   hostalloc  cudaHostAlloc (the CUDA baseline)
// Every registered range is checked: its last byte is host-registered memory
// and 1 MiB at its end goes to the device and back intact.
// The summary names the floor: the fastest way to one registration of N.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << 26)
#endif

using Clock = std::chrono::steady_clock;
constexpr size_t MiB = size_t{1} << 20, GiB = size_t{1} << 30, kUnit = 2 * MiB;

static double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] static void die(const std::string& what) {
  std::fprintf(stderr, "pin-floor: ERROR: %s\n", what.c_str());
  std::exit(1);
}

static void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

static size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  switch (end && *end ? *end : ' ') {
    case 'G': case 'g': v *= GiB; break;
    case 'M': case 'm': v *= MiB; break;
    case 'K': case 'k': v *= 1024; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

static std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    out.push_back(std::atoi(s.substr(i, j - i).c_str()));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

// ---- memory ---------------------------------------------------------------------

enum class Kind { small4k, thp, hugetlb };
static const char* kind_name(Kind k) { return k == Kind::small4k ? "4k" : k == Kind::thp ? "thp" : "hugetlb"; }

static uint64_t free_hugepages() {
  FILE* f = std::fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
  if (!f) return 0;
  unsigned long long v = 0;
  if (std::fscanf(f, "%llu", &v) != 1) v = 0;
  std::fclose(f);
  return v;
}

struct Region {
  char* p = nullptr;
  size_t bytes = 0;
  Kind kind = Kind::thp;
  const char* populate_error = nullptr;  // why MADV_POPULATE_WRITE failed
};

static Region map_region(size_t bytes, Kind kind, bool populate = false) {
  Region r{nullptr, bytes, kind};
  if (kind == Kind::hugetlb) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB | (populate ? MAP_POPULATE : 0), -1, 0);
    if (p == MAP_FAILED) die("mmap hugetlb " + std::to_string(bytes >> 20) + " MiB: " + std::strerror(errno));
    r.p = static_cast<char*>(p);
    return r;
  }
  void* raw = mmap(nullptr, bytes + kUnit, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) die(std::string("mmap: ") + std::strerror(errno));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(raw) + kUnit - 1) & ~(kUnit - 1);
  const size_t head = a - reinterpret_cast<uintptr_t>(raw);
  if (head) munmap(raw, head);
  munmap(reinterpret_cast<char*>(a) + bytes, kUnit - head);
  r.p = reinterpret_cast<char*>(a);
  madvise(r.p, bytes, kind == Kind::thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  if (populate) {  // the kernel touches, on one thread
#ifdef MADV_POPULATE_WRITE
    if (madvise(r.p, bytes, MADV_POPULATE_WRITE) != 0) r.populate_error = std::strerror(errno);
#else
    r.populate_error = "MADV_POPULATE_WRITE is not in this system's headers";
#endif
  }
  return r;
}

static double unmap_region(Region& r) {
  const auto t0 = Clock::now();
  munmap(r.p, r.bytes);
  r.p = nullptr;
  return since(t0);
}

// Threads claim 2 MiB units front to back; prefix = units [0, prefix) done.
class Toucher {
 public:
  Toucher(char* base, size_t bytes, size_t from, int threads)
      : base_(base), bytes_(bytes), units_((bytes + kUnit - 1) / kUnit), next_(from / kUnit), done_(units_, false),
        prefix_(from / kUnit) {
    for (size_t u = 0; u < prefix_; ++u) done_[u] = true;
    start_ = Clock::now();
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  void wait_prefix(size_t bytes) {
    const size_t units = std::min(units_, (bytes + kUnit - 1) / kUnit);
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return prefix_ >= units; });
  }
  double join() {
    for (auto& t : threads_) t.join();
    return std::chrono::duration<double>(end_ - start_).count();
  }

 private:
  void run() {
    for (;;) {
      const size_t u = next_.fetch_add(1);
      if (u >= units_) return;
      char* b = base_ + u * kUnit;
      char* e = base_ + std::min(bytes_, (u + 1) * kUnit);
      for (volatile char* q = b; q < e; q += 4096) *q = 0;
      std::lock_guard lock(mu_);
      done_[u] = true;
      while (prefix_ < units_ && done_[prefix_]) ++prefix_;
      if (prefix_ == units_) end_ = Clock::now();
      cv_.notify_all();
    }
  }
  char* base_;
  size_t bytes_, units_;
  std::atomic<size_t> next_;
  std::vector<bool> done_;
  size_t prefix_;
  std::mutex mu_;
  std::condition_variable cv_;
  Clock::time_point start_, end_;
  std::vector<std::thread> threads_;
};

static double touch(Region& r, int threads, size_t from = 0) {
  Toucher t(r.p, r.bytes, from, threads);
  return t.join();
}

// ---- CUDA ----------------------------------------------------------------------------

static void* g_dev = nullptr;

static double reg(char* p, size_t bytes) {
  const auto t0 = Clock::now();
  cuda_ok(cudaHostRegister(p, bytes, cudaHostRegisterDefault), "cudaHostRegister");
  return since(t0);
}

static double unreg(char* p) {
  const auto t0 = Clock::now();
  cuda_ok(cudaHostUnregister(p), "cudaHostUnregister");
  return since(t0);
}

// The last byte is registered host memory; 1 MiB at the end round-trips.
static void verify(char* p, size_t bytes) {
  cudaPointerAttributes a{};
  cuda_ok(cudaPointerGetAttributes(&a, p + bytes - 1), "cudaPointerGetAttributes");
  if (a.type != cudaMemoryTypeHost) die("the end of a registered range is not registered host memory");
  const size_t n = std::min(bytes, MiB);
  char* tail = p + bytes - n;
  for (size_t i = 0; i < n; ++i) tail[i] = static_cast<char>(i * 7 + 1);
  cuda_ok(cudaMemcpy(g_dev, tail, n, cudaMemcpyHostToDevice), "cudaMemcpy h2d");
  std::memset(tail, 0x5A, n);
  cuda_ok(cudaMemcpy(tail, g_dev, n, cudaMemcpyDeviceToHost), "cudaMemcpy d2h");
  for (size_t i = 0; i < n; ++i)
    if (tail[i] != static_cast<char>(i * 7 + 1)) die("round trip through a registered range corrupted data");
}

// ---- results ------------------------------------------------------------------------

struct Row {
  std::string test, kind, detail;
  size_t bytes = 0;
  double touch_s = 0, register_s = 0, total_s = 0, unregister_s = 0, unmap_s = 0;
  int registrations = 1;
};
static std::vector<Row> g_rows;

static void print_row(const Row& r) {
  const double gbs = r.total_s > 0 ? r.bytes / r.total_s / 1e9 : 0;
  std::printf("%-10s %-8s %-26s %6zu MiB  touch %8.1f ms  register %8.1f ms  total %8.1f ms  %6.1f GB/s  unreg %6.1f ms  unmap %6.1f ms%s\n",
              r.test.c_str(), r.kind.c_str(), r.detail.c_str(), r.bytes >> 20, r.touch_s * 1e3, r.register_s * 1e3,
              r.total_s * 1e3, gbs, r.unregister_s * 1e3, r.unmap_s * 1e3,
              r.registrations > 1 ? "  (several registrations)" : "");
  std::fflush(stdout);
  g_rows.push_back(r);
}

static void run_repeated(int repeats, const std::function<Row()>& once) {
  std::vector<Row> runs;
  for (int i = 0; i < repeats; ++i) runs.push_back(once());
  std::sort(runs.begin(), runs.end(), [](const Row& a, const Row& b) { return a.total_s < b.total_s; });
  Row median = runs[runs.size() / 2];
  if (repeats > 1) median.detail += " (median of " + std::to_string(repeats) + ")";
  print_row(median);
}

// ---- cases ------------------------------------------------------------------------------

// The end of a case with one registration: check it, unregister, unmap.
static void finish(Row& row, Region& r) {
  verify(r.p, r.bytes);
  row.unregister_s = unreg(r.p);
  row.unmap_s = unmap_region(r);
}

static Row case_touch(Kind k, size_t bytes, int threads) {
  Region r = map_region(bytes, k);
  Row row{"touch", kind_name(k), std::to_string(threads) + " threads", bytes};
  row.touch_s = row.total_s = touch(r, threads);
  row.registrations = 0;
  row.unmap_s = unmap_region(r);
  return row;
}

static Row case_register(Kind k, size_t bytes, bool touched, int threads) {
  Region r = map_region(bytes, k);
  Row row{"register", kind_name(k), touched ? "touched" : "untouched", bytes};
  if (touched) row.touch_s = touch(r, threads);
  row.register_s = row.total_s = reg(r.p, bytes);
  finish(row, r);
  return row;
}

static Row case_seq(Kind k, size_t bytes, int threads) {
  const auto t0 = Clock::now();
  Region r = map_region(bytes, k);
  Row row{"seq", kind_name(k), std::to_string(threads) + " threads", bytes};
  row.touch_s = touch(r, threads);
  row.register_s = reg(r.p, bytes);
  row.total_s = since(t0);
  finish(row, r);
  return row;
}

static Row case_overlap(Kind k, size_t bytes, int threads, size_t lead) {
  const auto t0 = Clock::now();
  Region r = map_region(bytes, k);
  Row row{"overlap", kind_name(k), std::to_string(threads) + "T lead " + std::to_string(lead >> 20) + "M", bytes};
  Toucher t(r.p, bytes, 0, threads);
  t.wait_prefix(lead);
  row.register_s = reg(r.p, bytes);
  row.touch_s = t.join();
  row.total_s = since(t0);
  finish(row, r);
  return row;
}

static Row case_pieces(Kind k, size_t bytes, int threads, int pieces) {
  Region r = map_region(bytes, k);
  Row row{"pieces", kind_name(k), std::to_string(pieces) + " registered at once", bytes};
  row.touch_s = touch(r, threads);
  const size_t piece = bytes / pieces / kUnit * kUnit;
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < pieces; ++i) {
    char* b = r.p + i * piece;
    const size_t n = i + 1 == pieces ? bytes - i * piece : piece;
    ts.emplace_back([b, n] { reg(b, n); });
  }
  for (auto& t : ts) t.join();
  row.register_s = since(t0);
  row.total_s = row.touch_s + row.register_s;
  row.registrations = pieces;
  for (int i = 0; i < pieces; ++i) verify(r.p + i * piece, i + 1 == pieces ? bytes - i * piece : piece);
  const auto u0 = Clock::now();
  for (int i = 0; i < pieces; ++i) unreg(r.p + i * piece);
  row.unregister_s = since(u0);
  row.unmap_s = unmap_region(r);
  return row;
}

static Row case_split(Kind k, size_t bytes, int threads) {
  const auto t0 = Clock::now();
  Region r = map_region(bytes, k);
  Row row{"split", kind_name(k), "half 1 registered while half 2 touched", bytes};
  const size_t half = bytes / 2 / kUnit * kUnit;
  Region first{r.p, half, k}, second{r.p + half, bytes - half, k};
  row.touch_s = touch(first, threads);
  std::thread toucher([&] { touch(second, threads); });
  row.register_s = reg(r.p, half);
  toucher.join();
  row.register_s += reg(r.p + half, bytes - half);
  row.total_s = since(t0);
  row.registrations = 2;
  verify(r.p, half);
  verify(r.p + half, bytes - half);
  const auto u0 = Clock::now();
  unreg(r.p);
  unreg(r.p + half);
  row.unregister_s = since(u0);
  row.unmap_s = unmap_region(r);
  return row;
}

static Row case_populate(Kind k, size_t bytes) {
  const auto t0 = Clock::now();
  Region r = map_region(bytes, k, true);
  Row row{"populate", kind_name(k), "MAP_POPULATE/POPULATE_WRITE", bytes};
  if (r.populate_error) {  // not measured: say why, register nothing
    row.detail = std::string("unsupported: ") + r.populate_error;
    row.registrations = 0;
    unmap_region(r);
    return row;
  }
  row.touch_s = since(t0);
  row.register_s = reg(r.p, bytes);
  row.total_s = since(t0);
  finish(row, r);
  return row;
}

static Row case_hostalloc(size_t bytes) {
  Row row{"hostalloc", "-", "cudaHostAlloc", bytes};
  void* p = nullptr;
  const auto t0 = Clock::now();
  cuda_ok(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  row.total_s = row.register_s = since(t0);
  verify(static_cast<char*>(p), bytes);
  const auto f0 = Clock::now();
  cuda_ok(cudaFreeHost(p), "cudaFreeHost");
  row.unregister_s = since(f0);
  return row;
}

// ---- main --------------------------------------------------------------------------------

static void write_json(const char* path, size_t bytes, int cores) {
  FILE* f = std::fopen(path, "w");
  if (!f) die(std::string("cannot write ") + path);
  int driver = 0, runtime = 0;
  if (g_dev) {
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
  }
  std::fprintf(f, "{\"probe\": \"pin-floor\", \"bytes\": %zu, \"cores\": %d, \"cuda_driver\": %d, \"cuda_runtime\": %d, \"rows\": [\n",
               bytes, cores, driver, runtime);
  for (size_t i = 0; i < g_rows.size(); ++i) {
    const Row& r = g_rows[i];
    std::fprintf(f,
                 "  {\"test\": \"%s\", \"kind\": \"%s\", \"detail\": \"%s\", \"bytes\": %zu, \"touch_s\": %.6f, "
                 "\"register_s\": %.6f, \"total_s\": %.6f, \"unregister_s\": %.6f, \"unmap_s\": %.6f, "
                 "\"registrations\": %d}%s\n",
                 r.test.c_str(), r.kind.c_str(), r.detail.c_str(), r.bytes, r.touch_s, r.register_s, r.total_s,
                 r.unregister_s, r.unmap_s, r.registrations, i + 1 < g_rows.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

int main(int argc, char** argv) {
  const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  size_t bytes = 8 * GiB, sweep = 2 * GiB;
  int repeats = 3;
  std::vector<int> threads = {1, 4, 8, cores};
  const char* json = nullptr;
  std::string only = "touch,register,seq,overlap,pieces,split,populate,hostalloc";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--bytes") bytes = parse_size(next());
    else if (a == "--sweep-bytes") sweep = parse_size(next());
    else if (a == "--threads") threads = parse_ints(next());
    else if (a == "--repeats") repeats = std::atoi(next().c_str());
    else if (a == "--json") json = argv[++i];
    else if (a == "--only") only = next();
    else die("usage: pin-floor [--bytes 8G] [--sweep-bytes 2G] [--threads 1,4,8,N] [--repeats 3] [--only LIST] [--json FILE]");
  }
  bytes = bytes / kUnit * kUnit;
  sweep = std::min(bytes, sweep / kUnit * kUnit);
  auto want = [&](const char* t) { return ("," + only + ",").find(std::string(",") + t + ",") != std::string::npos; };
  if (only != "touch") {  // the touch sweep alone runs without a GPU
    cuda_ok(cudaSetDevice(0), "cudaSetDevice");
    cuda_ok(cudaFree(nullptr), "context");
    cuda_ok(cudaMalloc(&g_dev, MiB), "cudaMalloc");
  }
  std::vector<Kind> kinds = {Kind::small4k, Kind::thp};
  const uint64_t free_pages = free_hugepages();
  if (free_pages * kUnit >= bytes) kinds.push_back(Kind::hugetlb);
  else std::printf("# hugetlb: %llu free 2 MiB pages, %zu needed: hugetlb cases skipped\n",
                   static_cast<unsigned long long>(free_pages), bytes / kUnit);
  std::printf("# pin-floor: %zu MiB (sweeps %zu MiB), %d cores, repeats %d\n", bytes >> 20, sweep >> 20, cores, repeats);

  if (want("touch"))
    for (Kind k : kinds)
      for (int t : threads) print_row(case_touch(k, t == 1 ? std::min(sweep, GiB) : sweep, t));
  if (want("register"))
    for (Kind k : kinds) {
      run_repeated(repeats, [&] { return case_register(k, bytes, true, cores); });
      print_row(case_register(k, k == Kind::small4k ? std::min(sweep, GiB) : sweep, false, cores));
    }
  if (want("seq"))
    for (Kind k : kinds) run_repeated(repeats, [&] { return case_seq(k, bytes, cores); });
  if (want("overlap"))
    for (Kind k : kinds)
      for (int t : {cores, std::max(1, cores - 1)})
        for (size_t lead : {size_t{0}, 64 * MiB, 512 * MiB, 2 * GiB})
          if (lead < bytes) run_repeated(t == cores && lead == 64 * MiB ? repeats : 1,
                                         [&] { return case_overlap(k, bytes, t, lead); });
  if (want("pieces"))
    for (Kind k : kinds)
      for (int n : {2, 4}) print_row(case_pieces(k, bytes, cores, n));
  if (want("split"))
    for (Kind k : kinds) print_row(case_split(k, bytes, cores));
  if (want("populate"))
    for (Kind k : kinds) print_row(case_populate(k, bytes));
  if (want("hostalloc")) print_row(case_hostalloc(bytes));

  // The floor: the fastest one-registration way to N pinned bytes.
  const Row* best = nullptr;
  for (const Row& r : g_rows)
    if (r.bytes == bytes && r.registrations == 1 && (r.test == "seq" || r.test == "overlap" || r.test == "populate"))
      if (!best || r.total_s < best->total_s) best = &r;
  if (best)
    std::printf("# floor for %zu MiB in one registration: %.1f ms (%s %s %s)\n", bytes >> 20, best->total_s * 1e3,
                best->test.c_str(), best->kind.c_str(), best->detail.c_str());
  for (Kind k : kinds) {
    double touch_best = 0, reg_best = 0;
    for (const Row& r : g_rows) {
      if (r.kind != kind_name(k)) continue;
      if (r.test == "touch" && r.total_s > 0) touch_best = std::max(touch_best, r.bytes / r.total_s / 1e9);
      if (r.test == "register" && r.detail.rfind("touched", 0) == 0 && r.register_s > 0)
        reg_best = std::max(reg_best, r.bytes / r.register_s / 1e9);
    }
    std::printf("# %s: best touch %.1f GB/s, register (touched) %.1f GB/s\n", kind_name(k), touch_best, reg_best);
  }
  if (json) write_json(json, bytes, cores);
  if (g_dev) cudaFree(g_dev);
  return 0;
}
