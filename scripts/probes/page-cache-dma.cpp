// page-cache-dma.cpp — can the DMA engine read a file's page-cache pages
// directly (one pass through host memory) faster than ferry's staged path
// (pread into pinned slots, then DMA: three passes)? Issue 40's first question.
//   page-cache-dma FILE [--piece 256M] [--chunk 32M] [--threads 1,4] [--device 0]
//
// The file should be in the page cache (the probe reads it once first). For
// each registration piece size it measures, on a fresh read-only MAP_SHARED
// mapping of the whole file:
//   register    cudaHostRegister(cudaHostRegisterReadOnly) of every piece, by
//               1 or T threads at once (does the driver pin in parallel?)
//   dma         the registered mapping to device memory, chunk by chunk on two
//               streams (the first load after registration)
//   redma       the same again with the registration kept (a serving process
//               reloading weights it registered once)
//   pipelined   register piece k+1 while piece k's DMA runs (a first load)
//   unregister  cudaHostUnregister of every piece
// and then what a registration does when the file changes under it (on a
// small file of its own beside FILE): a pwrite of new bytes, a truncate, a
// rename over the path. Every DMA is checked against the file's bytes at 64
// places.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;
constexpr size_t MiB = size_t{1} << 20, GiB = size_t{1} << 30;

static double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] static void die(const std::string& what) {
  std::fprintf(stderr, "page-cache-dma: ERROR: %s\n", what.c_str());
  std::exit(1);
}

static void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

static size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (*end) {
    case 'G': case 'g': v *= GiB; break;
    case 'M': case 'm': v *= MiB; break;
    case 'K': case 'k': v *= 1024; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

struct Mapping {
  unsigned char* base = nullptr;
  size_t bytes = 0;
};

static Mapping map_file(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) die("mmap: " + std::string(std::strerror(errno)));
  return {static_cast<unsigned char*>(p), bytes};
}

// Registers [first, last) pieces; returns the first error (cudaSuccess if none).
static cudaError_t register_pieces(const Mapping& m, size_t piece, size_t first, size_t last) {
  for (size_t i = first; i < last; ++i) {
    size_t off = i * piece, n = std::min(piece, m.bytes - off);
    cudaError_t e = cudaHostRegister(m.base + off, n, cudaHostRegisterReadOnly);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

static double register_all(const Mapping& m, size_t piece, int threads) {
  const size_t pieces = (m.bytes + piece - 1) / piece;
  auto t0 = Clock::now();
  std::vector<std::thread> ts;
  std::vector<cudaError_t> errs(threads, cudaSuccess);
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      size_t a = pieces * t / threads, b = pieces * (t + 1) / threads;
      errs[t] = register_pieces(m, piece, a, b);
    });
  for (auto& t : ts) t.join();
  for (auto e : errs) ok(e, "cudaHostRegister(ReadOnly) of a file mapping");
  return since(t0);
}

static double unregister_all(const Mapping& m, size_t piece) {
  auto t0 = Clock::now();
  for (size_t off = 0; off < m.bytes; off += piece) ok(cudaHostUnregister(m.base + off), "cudaHostUnregister");
  return since(t0);
}

static double dma(const Mapping& m, unsigned char* dev, size_t chunk, cudaStream_t s[2]) {
  auto t0 = Clock::now();
  size_t k = 0;
  for (size_t off = 0; off < m.bytes; off += chunk, ++k)
    ok(cudaMemcpyAsync(dev + off, m.base + off, std::min(chunk, m.bytes - off), cudaMemcpyHostToDevice, s[k & 1]),
       "cudaMemcpyAsync");
  ok(cudaStreamSynchronize(s[0]), "sync");
  ok(cudaStreamSynchronize(s[1]), "sync");
  return since(t0);
}

// Registers piece k+1 on this thread while piece k's DMA runs.
static double pipelined(const Mapping& m, unsigned char* dev, size_t piece, size_t chunk, cudaStream_t s[2]) {
  auto t0 = Clock::now();
  const size_t pieces = (m.bytes + piece - 1) / piece;
  size_t k = 0;
  for (size_t i = 0; i < pieces; ++i) {
    ok(register_pieces(m, piece, i, i + 1), "cudaHostRegister (pipelined)");
    size_t end = std::min(m.bytes, (i + 1) * piece);
    for (size_t off = i * piece; off < end; off += chunk, ++k)
      ok(cudaMemcpyAsync(dev + off, m.base + off, std::min(chunk, end - off), cudaMemcpyHostToDevice, s[k & 1]),
         "cudaMemcpyAsync");
  }
  ok(cudaStreamSynchronize(s[0]), "sync");
  ok(cudaStreamSynchronize(s[1]), "sync");
  return since(t0);
}

// 64 places of 4 KiB: device bytes == file bytes (pread).
static bool check(int fd, size_t bytes, const unsigned char* dev) {
  std::vector<unsigned char> a(4096), b(4096);
  for (int i = 0; i < 64; ++i) {
    size_t off = (bytes - 4096) / 63 * i / 4096 * 4096;
    if (pread(fd, a.data(), 4096, static_cast<off_t>(off)) != 4096) die("pread");
    ok(cudaMemcpy(b.data(), dev + off, 4096, cudaMemcpyDeviceToHost), "check copy");
    if (a != b) return false;
  }
  return true;
}

static void change_under_registration(const std::string& dir) {
  const size_t bytes = 64 * MiB;
  // per process: several probes may run at once beside one FILE (one per GPU)
  const std::string pid = std::to_string(getpid());
  std::string path = dir + "/page-cache-dma.small." + pid, other = dir + "/page-cache-dma.other." + pid;
  auto write_file = [&](const std::string& p, unsigned char fill) {
    int fd = open(p.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (fd < 0) die("open " + p);
    std::vector<unsigned char> buf(bytes, fill);
    if (write(fd, buf.data(), bytes) != static_cast<ssize_t>(bytes)) die("write");
    fsync(fd);
    close(fd);
  };
  void* dev = nullptr;
  ok(cudaMalloc(&dev, bytes), "cudaMalloc");
  for (const char* change : {"pwrite", "truncate", "rename"}) {
    write_file(path, 0x11);
    int fd = open(path.c_str(), O_RDONLY);
    Mapping m = map_file(fd, bytes);
    ok(cudaHostRegister(m.base, bytes, cudaHostRegisterReadOnly), "register small");
    std::string what = change;
    if (what == "pwrite") {
      int w = open(path.c_str(), O_WRONLY);
      std::vector<unsigned char> buf(bytes, 0x22);
      if (pwrite(w, buf.data(), bytes, 0) != static_cast<ssize_t>(bytes)) die("pwrite");
      close(w);
    } else if (what == "truncate") {
      if (truncate(path.c_str(), static_cast<off_t>(bytes / 2)) != 0) die("truncate");
    } else {
      write_file(other, 0x33);
      if (rename(other.c_str(), path.c_str()) != 0) die("rename");
    }
    ok(cudaMemset(dev, 0xEE, bytes), "memset");
    cudaError_t e = cudaMemcpy(dev, m.base, bytes, cudaMemcpyHostToDevice);
    unsigned char head = 0, tail = 0;
    if (e == cudaSuccess) {
      ok(cudaMemcpy(&head, dev, 1, cudaMemcpyDeviceToHost), "head");
      ok(cudaMemcpy(&tail, static_cast<unsigned char*>(dev) + bytes - 1, 1, cudaMemcpyDeviceToHost), "tail");
    } else {
      cudaGetLastError();
    }
    std::printf("change %-8s: DMA %s; first byte 0x%02x, last byte 0x%02x (was 0x11; new 0x22/0x33; 0xee not written)\n",
                change, e == cudaSuccess ? "ok" : cudaGetErrorString(e), head, tail);
    cudaHostUnregister(m.base);
    munmap(m.base, bytes);
    close(fd);
  }
  unlink(path.c_str());
  cudaFree(dev);
}

int main(int argc, char** argv) {
  if (argc < 2) die("usage: page-cache-dma FILE [--piece 256M,1G] [--chunk 32M] [--threads 1,4] [--device 0]");
  std::string file = argv[1];
  std::vector<size_t> pieces = {256 * MiB, 1 * GiB};
  std::vector<int> thread_counts = {1, 4};
  size_t chunk = 32 * MiB;
  int device = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--chunk") chunk = parse_size(argv[i + 1]);
    else if (a == "--device") device = std::atoi(argv[i + 1]);
    else if (a == "--piece" || a == "--threads") {
      std::string list = argv[i + 1];
      if (a == "--piece") pieces.clear(); else thread_counts.clear();
      for (size_t p = 0; p < list.size();) {
        size_t q = list.find(',', p);
        std::string item = list.substr(p, q == std::string::npos ? std::string::npos : q - p);
        if (a == "--piece") pieces.push_back(parse_size(item.c_str())); else thread_counts.push_back(std::atoi(item.c_str()));
        p = q == std::string::npos ? list.size() : q + 1;
      }
    } else die("unknown argument " + a);
  }
  ok(cudaSetDevice(device), "cudaSetDevice");
  utsname u{};
  uname(&u);
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, device), "props");
  int fd = open(file.c_str(), O_RDONLY);
  if (fd < 0) die("open " + file);
  struct stat st{};
  fstat(fd, &st);
  const size_t bytes = static_cast<size_t>(st.st_size) / 4096 * 4096;
  std::printf("page-cache-dma: %s, %.2f GB, GPU %d %s, kernel %s\n", file.c_str(), bytes / 1e9, device, prop.name,
              u.release);
  {  // warm the page cache
    std::vector<unsigned char> buf(64 * MiB);
    auto t0 = Clock::now();
    for (size_t off = 0; off < bytes; off += buf.size()) (void)!pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
    std::printf("warm read (pread into pageable, 1 thread): %.1f GB/s\n", bytes / since(t0) / 1e9);
  }
  unsigned char* dev = nullptr;
  ok(cudaMalloc(reinterpret_cast<void**>(&dev), bytes), "cudaMalloc");
  cudaStream_t s[2];
  ok(cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking), "stream");
  ok(cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking), "stream");
  {  // the link: pinned host memory to device
    void* h = nullptr;
    size_t n = std::min(bytes, 2 * GiB);
    ok(cudaHostAlloc(&h, n, cudaHostAllocDefault), "cudaHostAlloc");
    Mapping hm{static_cast<unsigned char*>(h), n};
    dma(hm, dev, chunk, s);
    double t = dma(hm, dev, chunk, s);
    std::printf("link (cudaHostAlloc -> device, %zu MiB chunks): %.1f GB/s\n", chunk / MiB, n / t / 1e9);
    cudaFreeHost(h);
  }
  for (size_t piece : pieces) {
    for (int threads : thread_counts) {
      Mapping m = map_file(fd, bytes);
      double reg = register_all(m, piece, threads);
      ok(cudaMemset(dev, 0xEE, bytes), "memset");
      ok(cudaDeviceSynchronize(), "memset sync");  // the DMA streams are non-blocking: they would not wait
      double d1 = dma(m, dev, chunk, s);
      bool good = check(fd, bytes, dev);
      double d2 = dma(m, dev, chunk, s);
      double unreg = unregister_all(m, piece);
      munmap(m.base, bytes);
      std::printf("piece %5zu MiB, %d thread(s): register %.2f s (%.1f GB/s), dma %.1f GB/s, redma %.1f GB/s, "
                  "unregister %.3f s, first load register+dma %.1f GB/s, bytes %s\n",
                  piece / MiB, threads, reg, bytes / reg / 1e9, bytes / d1 / 1e9, bytes / d2 / 1e9, unreg,
                  bytes / (reg + d1) / 1e9, good ? "equal" : "DIFFER");
    }
    Mapping m = map_file(fd, bytes);
    ok(cudaMemset(dev, 0xEE, bytes), "memset");
    ok(cudaDeviceSynchronize(), "memset sync");
    double p = pipelined(m, dev, piece, chunk, s);
    bool good = check(fd, bytes, dev);
    unregister_all(m, piece);
    munmap(m.base, bytes);
    std::printf("piece %5zu MiB, pipelined register->dma: %.1f GB/s, bytes %s\n", piece / MiB, bytes / p / 1e9,
                good ? "equal" : "DIFFER");
  }
  std::string dir = file.substr(0, file.find_last_of('/') == std::string::npos ? 0 : file.find_last_of('/'));
  change_under_registration(dir.empty() ? "." : dir);
  cudaFree(dev);
  close(fd);
  return 0;
}
