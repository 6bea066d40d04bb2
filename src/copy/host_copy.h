// host_copy.h — the CPU's half of a staged copy. Both directions use
// non-temporal (streaming) stores where the CPU has them (AVX2), measured on
// the H200 machine (16 threads; scripts/probes/eager-trace.cpp):
//
//   into staging   a DMA that reads lines the CPU has just written with plain
//                  stores must pull each one out of a core's private cache:
//                  16 MiB took 569 us instead of 330. Written with streaming
//                  stores it took 318 us, though the CPU copy itself is slower
//                  (55-64 against 74-93 GB/s into a small reused area).
//   out of staging the user's buffer is not read back soon, and streaming
//                  stores skip reading each destination line before writing
//                  it: 116 against 61 GB/s from a cache-resident area, 56
//                  against 38 from fresh memory (scripts/probes/staging-sweep).
//
// Plain memcpy below 16 KiB (the fence costs more than the lines) and on CPUs
// without AVX2. Pure functions: no allocation, no system calls, any thread.
#pragma once

#include <cstddef>

namespace ferry {

// Both end with a store fence: the bytes are visible to other threads (and to
// a DMA engine started after a later release store) once they return.
void copy_to_staging(void* dst, const void* src, size_t n) noexcept;
void copy_from_staging(void* dst, const void* src, size_t n) noexcept;
// Whether the copies use non-temporal stores on this CPU.
bool streaming_stores_available() noexcept;

// Drops [p, p + n) from every CPU cache (clflushopt; nothing where the CPU
// lacks it). For staging memory the CPU has read and a DMA will write next: a
// device->host DMA into lines still cached by the cores that read them took
// 670 us for 16 MiB instead of 309 (H200 machine).
void evict_from_caches(const void* p, size_t n) noexcept;

}  // namespace ferry
