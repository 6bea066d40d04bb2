// memory.cpp — mmap, munmap, madvise, memfd_create, ftruncate and mbind.
#include "os/memory.h"

#include <linux/memfd.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "core/fault.h"

namespace ferry::os {
namespace {

bool is_power_of_two(size_t v) { return v && (v & (v - 1)) == 0; }

int huge_page_shift(size_t page_bytes) {
  if (page_bytes == kHugePage2MBytes) return 21;
  if (page_bytes == kHugePage1GBytes) return 30;
  return -1;
}

int advise(void* p, size_t bytes, int advice) noexcept {
  if (int err = fault_error(FaultPoint::madvise, EINVAL)) return err;
  return ::madvise(p, bytes, advice) == 0 ? 0 : errno;
}

// Reserves an aligned range: maps `bytes + alignment - 4 KiB` with `prot` and
// `flags`, then unmaps the unaligned head and the tail.
int map_aligned(size_t bytes, size_t alignment, int prot, int flags, void** out) noexcept {
  if (!is_power_of_two(alignment) || alignment < kSmallPageBytes) return EINVAL;
  const size_t slack = alignment - kSmallPageBytes;
  if (bytes == 0 || bytes > SIZE_MAX - slack) return EINVAL;
  const size_t span = bytes + slack;
  void* raw = ::mmap(nullptr, span, prot, flags, -1, 0);
  if (raw == MAP_FAILED) return errno;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + alignment - 1) & ~(alignment - 1);
  if (aligned > begin) ::munmap(raw, aligned - begin);
  const uintptr_t end = aligned + bytes, raw_end = begin + span;
  if (raw_end > end) ::munmap(reinterpret_cast<void*>(end), raw_end - end);
  *out = reinterpret_cast<void*>(aligned);
  return 0;
}

}  // namespace

int map_anonymous(size_t bytes, size_t alignment, void** out) noexcept {
  if (int err = fault_error(FaultPoint::mmap, ENOMEM)) return err;
  return map_aligned(bytes, alignment, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, out);
}

int map_hugetlb(size_t bytes, size_t page_bytes, void** out) noexcept {
  const int shift = huge_page_shift(page_bytes);
  if (shift < 0 || bytes == 0 || bytes % page_bytes != 0) return EINVAL;
  if (int err = fault_error(FaultPoint::mmap, ENOMEM)) return err;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (shift << MAP_HUGE_SHIFT), -1, 0);
  if (p == MAP_FAILED) return errno;
  *out = p;
  return 0;
}

int create_memfd(const char* name, size_t bytes, size_t huge_page_bytes, int* fd_out) noexcept {
  unsigned flags = MFD_CLOEXEC;
  if (huge_page_bytes != 0) {
    const int shift = huge_page_shift(huge_page_bytes);
    if (shift < 0 || bytes % huge_page_bytes != 0) return EINVAL;
    flags |= MFD_HUGETLB | (static_cast<unsigned>(shift) << MFD_HUGE_SHIFT);
  }
  if (int err = fault_error(FaultPoint::memfd, ENOMEM)) return err;
  const int fd = ::memfd_create(name, flags);
  if (fd < 0) return errno;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

int map_shared(int fd, size_t bytes, size_t alignment, void** out) noexcept {
  if (int err = fault_error(FaultPoint::mmap, ENOMEM)) return err;
  void* reservation = nullptr;
  int err = map_aligned(bytes, alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        &reservation);
  if (err != 0) return err;
  void* p = ::mmap(reservation, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    err = errno;
    ::munmap(reservation, bytes);
    return err;
  }
  *out = p;
  return 0;
}

int close_fd(int fd) noexcept { return ::close(fd) == 0 ? 0 : errno; }

int unmap(void* p, size_t bytes) noexcept { return ::munmap(p, bytes) == 0 ? 0 : errno; }

int advise_huge(void* p, size_t bytes) noexcept { return advise(p, bytes, MADV_HUGEPAGE); }
int advise_no_huge(void* p, size_t bytes) noexcept { return advise(p, bytes, MADV_NOHUGEPAGE); }
int advise_dont_need(void* p, size_t bytes) noexcept { return advise(p, bytes, MADV_DONTNEED); }
int advise_remove(void* p, size_t bytes) noexcept { return advise(p, bytes, MADV_REMOVE); }

int populate_write(void* p, size_t bytes) noexcept {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older headers lack the name
#endif
  return advise(p, bytes, MADV_POPULATE_WRITE);
}

int bind_to_node(void* p, size_t bytes, int node) noexcept {
  constexpr int kMaxNodes = 1024;
  constexpr int kBitsPerWord = 8 * sizeof(unsigned long);
  if (node < 0 || node >= kMaxNodes) return EINVAL;
  unsigned long mask[kMaxNodes / kBitsPerWord] = {};
  mask[node / kBitsPerWord] = 1ul << (node % kBitsPerWord);
  // The kernel reads maxnode - 1 bits (a historical off-by-one libnuma also
  // works around), hence the + 1.
  const long r = ::syscall(SYS_mbind, p, bytes, MPOL_BIND, mask, kMaxNodes + 1, 0);
  return r == 0 ? 0 : errno;
}

}  // namespace ferry::os
