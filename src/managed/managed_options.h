// managed_options.h — the pure policy of ferry's PyTorch allocators: their
// names, their option strings, and the oversubscription guard. No CUDA here, so
// all of it is unit-tested on any machine (tests/core/managed_options_test.cpp).
//
// Allocators: `device` (cudaMalloc/cudaFree, no options), `managed`
// (cudaMallocManaged per allocation), `managed_pool` (ManagedPool over
// cudaMallocManaged chunks).
//
// Option strings: "key=value" pairs separated by commas, whitespace ignored,
// "" = defaults. Keys (and which allocators take them):
//   prefetch      managed: 0|1 (default 0) — cudaMemPrefetchAsync of each
//                 allocation to its device on the allocating stream.
//                 managed_pool: 0|1|alloc|chunk (default alloc=1) — each
//                 allocation, or each new chunk once when it is obtained.
//   advise        managed, managed_pool: none or names joined by '+':
//                 preferred_location, accessed_by, read_mostly (default none);
//                 cudaMemAdvise with the allocating device as the location
//                 (managed_pool: once per chunk).
//   oversubscribe managed, managed_pool: 0|1 (default 0) — allow asking for
//                 more managed memory than the device has (see below).
//   chunk_bytes   managed_pool: size of its large chunks, a multiple of 2 MiB
//                 (default 64MiB); sizes take K/M/G suffixes.
//   stream_wait   managed_pool: 0|1 (default 1) — reuse another stream's freed
//                 block by making this stream wait on its event.
// Unknown keys, keys the allocator does not take and bad values fail with
// InvalidArgument quoting them and saying what is accepted.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ferry {

enum class ManagedKind { device = 0, managed = 1, managed_pool = 2 };
inline constexpr int kManagedKinds = 3;

enum class PrefetchMode { none, alloc, chunk };

struct ManagedOptions {
  PrefetchMode prefetch = PrefetchMode::none;
  bool preferred_location = false;
  bool accessed_by = false;
  bool read_mostly = false;
  bool oversubscribe = false;
  size_t chunk_bytes = 64u << 20;
  bool stream_wait = true;

  bool any_advice() const { return preferred_location || accessed_by || read_mostly; }
  // Canonical text of the options that `kind` takes, e.g.
  // "prefetch=alloc,advise=none,oversubscribe=0,chunk_bytes=67108864,stream_wait=1".
  std::string text(ManagedKind kind) const;
};

const char* managed_kind_name(ManagedKind kind) noexcept;
// "device", "managed", "managed_pool"; anything else: InvalidArgument listing them.
ManagedKind parse_managed_kind(std::string_view name);
ManagedOptions default_managed_options(ManagedKind kind);
// Throws InvalidArgument (quoting the bad part) for unknown or inapplicable
// keys, bad values, or a key given twice.
ManagedOptions parse_managed_options(ManagedKind kind, std::string_view text);

// The oversubscription guard. Refuses (OutOfMemory) when, unless oversubscribe:
//   asked > free_bytes                      (what cudaMemGetInfo reports free), or
//   live_managed_bytes + asked > total_bytes (managed memory this process holds
//                                             on the device, counted even where
//                                             it is not resident yet).
// The message says what was asked, what is free, what ferry already holds,
// and how to allow it. `what` names the allocator and device for the message.
void check_managed_budget(size_t asked, size_t free_bytes, size_t total_bytes,
                          size_t live_managed_bytes, bool oversubscribe, const std::string& what);

}  // namespace ferry
