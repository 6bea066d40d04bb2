// gdrcopy.cpp — run-time discovery of GDRCopy (dlopen of libgdrapi.so.2,
// /dev/gdrdrv) and writes through its mappings. See gdrcopy.h.
#include "cuda/channel/gdrcopy.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ferry::cuda {
namespace {

constexpr const char* kLibrary = "libgdrapi.so.2";
constexpr const char* kDevice = "/dev/gdrdrv";
constexpr uintptr_t kGpuPage = uintptr_t{1} << 16;  // GDRCopy's GPU_PAGE_SIZE

// The subset of gdrapi.h (API 2.x) ferry calls; gdr_t and gdr_mh_t as GDRCopy
// defines them.
struct GdrMemoryHandle {
  unsigned long h;
};
struct GdrInfoV2 {
  uint64_t va;
  uint64_t mapped_size;
  uint32_t page_size;
  uint64_t tm_cycles;
  uint32_t cycles_per_ms;
  unsigned mapped : 1;
  unsigned wc_mapping : 1;
  int mapping_type;
};

struct GdrApi {
  void* (*open)();
  int (*close)(void*);
  int (*pin_buffer)(void*, unsigned long, size_t, uint64_t, uint32_t, GdrMemoryHandle*);
  int (*unpin_buffer)(void*, GdrMemoryHandle);
  int (*get_info_v2)(void*, GdrMemoryHandle, GdrInfoV2*);
  int (*map)(void*, GdrMemoryHandle, void**, size_t);
  int (*unmap)(void*, GdrMemoryHandle, void*, size_t);
  int (*copy_to_mapping)(GdrMemoryHandle, void*, const void*, size_t);
  int (*copy_from_mapping)(GdrMemoryHandle, void*, const void*, size_t);
  void (*runtime_get_version)(int*, int*);
  int (*driver_get_version)(void*, int*, int*);
};

GdrApi g_api{};  // filled once by probe(), read-only afterwards

template <class F>
void resolve(void* library, const char* name, F& out, std::string& missing) {
  out = reinterpret_cast<F>(dlsym(library, name));
  if (!out) missing += std::string(missing.empty() ? "" : ", ") + name;
}

GdrcopyStatus probe() {
  GdrcopyStatus s;
  std::string problems;
  struct stat st {};
  if (stat(kDevice, &st) != 0) {
    problems = std::string("no ") + kDevice + ": the gdrdrv kernel module is not loaded (" +
               std::strerror(errno) +
               "); install GDRCopy's gdrdrv and load it (modprobe gdrdrv) on a host that "
               "allows kernel modules; VMs without module loading cannot use GDRCopy";
  }
  void* library = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* why = dlerror();
    problems += std::string(problems.empty() ? "" : "; ") + kLibrary + " not found (" +
                (why ? why : "dlopen failed") + "): install GDRCopy's library (libgdrapi)";
  }
  if (!problems.empty()) {
    s.reason = problems;
    return s;
  }
  std::string missing;
  GdrApi api{};
  resolve(library, "gdr_open", api.open, missing);
  resolve(library, "gdr_close", api.close, missing);
  resolve(library, "gdr_pin_buffer", api.pin_buffer, missing);
  resolve(library, "gdr_unpin_buffer", api.unpin_buffer, missing);
  resolve(library, "gdr_get_info_v2", api.get_info_v2, missing);
  resolve(library, "gdr_map", api.map, missing);
  resolve(library, "gdr_unmap", api.unmap, missing);
  resolve(library, "gdr_copy_to_mapping", api.copy_to_mapping, missing);
  resolve(library, "gdr_copy_from_mapping", api.copy_from_mapping, missing);
  resolve(library, "gdr_runtime_get_version", api.runtime_get_version, missing);
  resolve(library, "gdr_driver_get_version", api.driver_get_version, missing);
  if (!missing.empty()) {
    s.reason = std::string(kLibrary) + " lacks " + missing + ": GDRCopy 2.1 or later is needed";
    return s;
  }
  void* g = api.open();
  if (!g) {
    s.reason = std::string("gdr_open failed: ") + kDevice +
               " exists but cannot be opened (check its permissions and that gdrdrv matches "
               "the NVIDIA driver)";
    return s;
  }
  int lib_major = 0, lib_minor = 0, drv_major = 0, drv_minor = 0;
  api.runtime_get_version(&lib_major, &lib_minor);
  api.driver_get_version(g, &drv_major, &drv_minor);
  api.close(g);
  g_api = api;
  s.available = true;
  s.reason = std::string(kLibrary) + " " + std::to_string(lib_major) + "." +
             std::to_string(lib_minor) + ", gdrdrv " + std::to_string(drv_major) + "." +
             std::to_string(drv_minor);
  return s;
}

}  // namespace

const GdrcopyStatus& gdrcopy_status() noexcept {
  static const GdrcopyStatus status = [] {
    try {
      return probe();
    } catch (...) {
      GdrcopyStatus s;
      s.reason = "GDRCopy probe failed: out of memory";
      return s;
    }
  }();
  return status;
}

// One pinned and mapped allocation (or a remembered failure to pin it).
struct GdrcopyWriter::Mapping {
  void* gdr = nullptr;
  unsigned long long buffer_id = 0;
  bool usable = false;
  GdrMemoryHandle handle{};
  bool pinned = false;
  void* cpu_base = nullptr;  // CPU address of pinned_start
  size_t mapped_bytes = 0;
  uintptr_t pinned_start = 0;

  ~Mapping() {
    if (cpu_base) g_api.unmap(gdr, handle, cpu_base, mapped_bytes);
    if (pinned) g_api.unpin_buffer(gdr, handle);
  }
};

GdrcopyWriter::GdrcopyWriter() {
  const GdrcopyStatus& s = gdrcopy_status();
  if (!s.available) throw NotSupported("GDRCopy is not available: " + s.reason);
  gdr_ = g_api.open();
  if (!gdr_) throw NotSupported(std::string("gdr_open failed: cannot open ") + kDevice);
}

GdrcopyWriter::~GdrcopyWriter() {
  mappings_.clear();  // unmaps and unpins; no write is in flight (the channel drained)
  g_api.close(gdr_);
}

std::shared_ptr<GdrcopyWriter::Mapping> GdrcopyWriter::mapping_for(const DeviceAllocation& a) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto hit = std::find_if(mappings_.begin(), mappings_.end(),
                          [&](const auto& m) { return m->buffer_id == a.buffer_id; });
  if (hit != mappings_.end()) {
    std::rotate(hit, hit + 1, mappings_.end());  // most recently used last
    return mappings_.back();
  }
  auto m = std::make_shared<Mapping>();
  m->gdr = gdr_;
  m->buffer_id = a.buffer_id;
  // Pin whole GPU pages around the allocation; its neighbours in the same pages
  // belong to the same driver allocation, else the pin fails and is remembered.
  const uintptr_t start = a.start & ~(kGpuPage - 1);
  const uintptr_t end = (a.start + a.size + kGpuPage - 1) & ~(kGpuPage - 1);
  if (g_api.pin_buffer(gdr_, start, end - start, 0, 0, &m->handle) == 0) {
    m->pinned = true;
    void* cpu = nullptr;
    GdrInfoV2 info{};
    if (g_api.map(gdr_, m->handle, &cpu, end - start) == 0) {
      m->cpu_base = cpu;
      m->mapped_bytes = end - start;
      // The pin started on a GPU page, so the mapping starts at info.va == start.
      m->usable = g_api.get_info_v2(gdr_, m->handle, &info) == 0 && info.va == start;
      m->pinned_start = start;
    }
  }
  if (mappings_.size() >= kMaxMappings) mappings_.erase(mappings_.begin());
  mappings_.push_back(m);
  return m;
}

bool GdrcopyWriter::write(const DeviceAllocation& allocation, void* dst, const void* src,
                          size_t n) {
  std::shared_ptr<Mapping> m = mapping_for(allocation);
  if (!m->usable) return false;
  char* cpu_dst = static_cast<char*>(m->cpu_base) + (reinterpret_cast<uintptr_t>(dst) - m->pinned_start);
  if (g_api.copy_to_mapping(m->handle, cpu_dst, src, n) != 0)
    throw CudaError("gdr_copy_to_mapping failed for " + format_bytes(n), 0);
  unsigned char flush = 0;
  if (g_api.copy_from_mapping(m->handle, &flush, cpu_dst, 1) != 0)
    throw CudaError("gdr_copy_from_mapping (flush after a write) failed", 0);
  return true;
}

}  // namespace ferry::cuda
