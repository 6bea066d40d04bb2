// host_copy.h — the CPU's half of a staged copy, with the store kind chosen
// by where the bytes go (measured on the H200 machine, 16 threads, 1 GiB moved;
// scripts/probes/staging-sweep.cpp):
//
//   into staging   plain stores. The staging area is reused and small enough to
//                  stay in the CPU's caches, where the DMA engine reads it: 74-93
//                  GB/s into a 4-16 MiB ring against 37 GB/s into fresh memory.
//                  Non-temporal stores would push it out to DRAM (55 GB/s).
//   out of staging non-temporal stores where the CPU has them: the user's buffer
//                  is not read back soon, and streaming stores skip reading each
//                  destination line before writing it: 116 against 61 GB/s from
//                  a cache-resident ring, 56 against 38 from fresh memory.
//
// Both are plain memcpy for small sizes and on CPUs without AVX2. Pure
// functions: no allocation, no system calls, safe on any thread.
#pragma once

#include <cstddef>

namespace ferry {

void copy_to_staging(void* dst, const void* src, size_t n) noexcept;
// Ends with a store fence: the bytes are visible to other threads (and to a
// DMA engine told by a later release store) once this returns.
void copy_from_staging(void* dst, const void* src, size_t n) noexcept;
// Whether copy_from_staging uses non-temporal stores on this CPU.
bool streaming_stores_available() noexcept;

}  // namespace ferry
