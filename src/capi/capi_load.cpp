// capi_load.cpp — C API over the checkpoint loader (cuda/load/file_loader.h).
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "capi/guard.h"
#include "capi/struct_size.h"
#include "cuda/load/file_loader.h"

using ferry::capi::guarded;
using ferry::capi::live;
using ferry::capi::read_struct;
using ferry::capi::require;
using ferry::capi::write_struct;

struct ferry_loader : ferry::capi::HandleOf<ferry::capi::kLoaderMagic> {
  std::unique_ptr<ferry::cuda::Loader> loader;
};

namespace {

ferry::load::DirectIo to_cpp(ferry_direct_io_t d) {
  switch (d) {
    case FERRY_DIRECT_IO_AUTO: return ferry::load::DirectIo::automatic;
    case FERRY_DIRECT_IO_NEVER: return ferry::load::DirectIo::never;
    case FERRY_DIRECT_IO_ALWAYS: return ferry::load::DirectIo::always;
  }
  throw ferry::InvalidArgument("direct_io=" + std::to_string(static_cast<int>(d)) +
                               ": expected a ferry_direct_io_t value");
}

ferry_direct_io_t to_c(ferry::load::DirectIo d) {
  switch (d) {
    case ferry::load::DirectIo::never: return FERRY_DIRECT_IO_NEVER;
    case ferry::load::DirectIo::always: return FERRY_DIRECT_IO_ALWAYS;
    default: return FERRY_DIRECT_IO_AUTO;
  }
}

ferry::cuda::Progress progress_of(int p) {
  if (p < -1 || p > 1) throw ferry::InvalidArgument("progress=" + std::to_string(p) + ": expected -1, 0 or 1");
  if (p < 0) return ferry::cuda::Progress::automatic;
  return p ? ferry::cuda::Progress::always : ferry::cuda::Progress::never;
}

ferry_loader_options_t to_c(const ferry::cuda::LoaderOptions& o) {
  ferry_loader_options_t c{};
  c.struct_size = sizeof c;
  c.staging_bytes = o.staging_bytes;
  c.slot_bytes = o.slot_bytes;
  c.threads = o.threads;
  c.direct_io = to_c(o.direct_io);
  c.progress = -1;
  return c;
}

// The caller's options over the defaults (members beyond its struct_size keep them).
ferry::cuda::LoaderOptions to_cpp(const ferry_loader_options_t* given, int device) {
  ferry::cuda::LoaderOptions o = ferry::cuda::LoaderOptions::from_environment(device);
  if (!given) return o;
  const ferry_loader_options_t c = read_struct(given, to_c(o), "options");
  if (c.reserved != 0) throw ferry::InvalidArgument("options->reserved=" + std::to_string(c.reserved) + ": must be 0");
  if (c.retired_mapped_share != 0)
    throw ferry::InvalidArgument("options->retired_mapped_share=" + std::to_string(c.retired_mapped_share) +
                                 ": must be 0 (the mapped share was removed in API 1.3: it was slower than staging)");
  o.staging_bytes = c.staging_bytes;
  o.slot_bytes = c.slot_bytes;
  o.threads = c.threads;
  o.direct_io = to_cpp(c.direct_io);
  o.progress = progress_of(c.progress);
  return o;
}

}  // namespace

extern "C" {

ferry_status_t ferry_loader_options_defaults(ferry_loader_options_t* out) {
  return guarded([&] {
    require(out, "out");
    write_struct(out, to_c(ferry::cuda::LoaderOptions::from_environment(0)), "out");
  });
}

ferry_status_t ferry_loader_create(const ferry_loader_options_t* options, int device, ferry_loader_t* out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    ferry::cuda::LoaderOptions o = to_cpp(options, device);
    auto h = std::make_unique<ferry_loader>();
    h->loader = std::make_unique<ferry::cuda::Loader>(o);
    *out = h.release();
  });
}

ferry_status_t ferry_loader_destroy(ferry_loader_t loader) {
  return guarded([&] {
    ferry::capi::destroy(loader, "loader", [](ferry_loader& h) { h.loader.reset(); });
  });
}

ferry_status_t ferry_loader_load(ferry_loader_t loader, const char* const* files, size_t file_count,
                                 const ferry_load_range_t* ranges, size_t range_count, void* stream,
                                 ferry_load_stats_t* stats) {
  return guarded([&] {
    live(loader, "loader");
    if (stats) ferry::capi::caller_struct_size(stats, "stats");  // refused before the load, not after
    if (file_count) require(files, "files");
    if (range_count) require(ranges, "ranges");
    std::vector<std::string> names;
    for (size_t i = 0; i < file_count; ++i) {
      if (!files[i]) throw ferry::InvalidArgument("files[" + std::to_string(i) + "] is NULL");
      names.emplace_back(files[i]);
    }
    std::vector<ferry::load::FileRange> rs(range_count);
    for (size_t i = 0; i < range_count; ++i) {
      if (ranges[i].file >= file_count && ranges[i].bytes)
        throw ferry::InvalidArgument("ranges[" + std::to_string(i) + "].file=" + std::to_string(ranges[i].file) +
                                     " but " + std::to_string(file_count) + " files");
      rs[i] = {static_cast<uint32_t>(ranges[i].file), ranges[i].offset, ranges[i].bytes,
               reinterpret_cast<uintptr_t>(ranges[i].dst)};
    }
    ferry::cuda::LoadStats st = loader->loader->load(names, rs, static_cast<cudaStream_t>(stream));
    if (stats) {
      ferry_load_stats_t c{};
      c.struct_size = sizeof c;
      c.bytes = st.range_bytes;
      c.read_bytes = st.read_bytes;
      c.staged_bytes = st.staged_bytes;
      c.reads = st.reads;
      c.direct_reads = st.direct_reads;
      c.seconds = st.seconds;
      c.staging_bytes = st.staging_bytes;
      write_struct(stats, c, "stats");
    }
  });
}

}  // extern "C"
