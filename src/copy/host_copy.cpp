// host_copy.cpp — streaming copies into and out of staging.
#include "copy/host_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ferry {

#if defined(__x86_64__)

namespace {

// Below this a streaming copy gains nothing (the destination lines are few and
// the fence costs more than their reads).
constexpr size_t kStreamingMin = 16u << 10;

__attribute__((target("avx2"))) void copy_streaming_avx2(char* d, const char* s, size_t n) noexcept {
  const size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  std::memcpy(d + i, s + i, n - i);
  _mm_sfence();  // streaming stores are weakly ordered: publish them before any later flag
}

bool detect_avx2() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

bool detect_clflushopt() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("clflushopt");
}

__attribute__((target("clflushopt"))) void evict_clflushopt(const char* p, size_t n) noexcept {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  for (uintptr_t a = begin; a < end; a += 64) _mm_clflushopt(reinterpret_cast<void*>(a));
  _mm_sfence();
}

}  // namespace

bool streaming_stores_available() noexcept {
  static const bool avx2 = detect_avx2();
  return avx2;
}

namespace {

void copy_streaming(void* dst, const void* src, size_t n) noexcept {
  if (n < kStreamingMin || !streaming_stores_available()) {
    std::memcpy(dst, src, n);
    return;
  }
  copy_streaming_avx2(static_cast<char*>(dst), static_cast<const char*>(src), n);
}

}  // namespace

void copy_to_staging(void* dst, const void* src, size_t n) noexcept { copy_streaming(dst, src, n); }
void copy_from_staging(void* dst, const void* src, size_t n) noexcept { copy_streaming(dst, src, n); }

void evict_from_caches(const void* p, size_t n) noexcept {
  static const bool available = detect_clflushopt();
  if (available && n) evict_clflushopt(static_cast<const char*>(p), n);
}

#else

void evict_from_caches(const void*, size_t) noexcept {}

bool streaming_stores_available() noexcept { return false; }
void copy_to_staging(void* dst, const void* src, size_t n) noexcept { std::memcpy(dst, src, n); }
void copy_from_staging(void* dst, const void* src, size_t n) noexcept { std::memcpy(dst, src, n); }

#endif

}  // namespace ferry
