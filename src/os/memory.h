// memory.h — the system calls that map, advise, bind and unmap memory.
//
// mimalloc's prim.h contract: every function returns 0 or an errno value, sets
// its outputs only on success, throws nothing and applies no policy (which
// backing to try, what to do on failure: that is pool/arena's job). Each call
// site asks fault_injected() just before the real call and, when told to fail,
// returns the errno a real failure would give: ENOMEM for mmap and
// memfd_create, EINVAL for madvise.
#pragma once

#include <cstddef>

namespace ferry::os {

constexpr size_t kSmallPageBytes = size_t{4} << 10;
constexpr size_t kHugePage2MBytes = size_t{2} << 20;
constexpr size_t kHugePage1GBytes = size_t{1} << 30;

// Maps `bytes` of private anonymous read-write memory at an address aligned to
// `alignment`, by over-mapping and trimming the ends.
// Preconditions: bytes > 0 and a multiple of 4 KiB; alignment a power of two >= 4 KiB.
int map_anonymous(size_t bytes, size_t alignment, void** out) noexcept;

// Maps `bytes` of private anonymous memory backed by hugetlb pages of
// `page_bytes` (2 MiB or 1 GiB); the address is aligned to the page size.
// Preconditions: bytes is a multiple of page_bytes.
int map_hugetlb(size_t bytes, size_t page_bytes, void** out) noexcept;

// memfd_create(name, MFD_CLOEXEC [| MFD_HUGETLB | MFD_HUGE_2MB/1GB]) and
// ftruncate to `bytes`. huge_page_bytes: 0 (normal shmem), 2 MiB or 1 GiB.
int create_memfd(const char* name, size_t bytes, size_t huge_page_bytes, int* fd_out) noexcept;

// Maps [0, bytes) of `fd` MAP_SHARED read-write at an address aligned to
// `alignment` (an over-mapped PROT_NONE reservation is replaced in place).
int map_shared(int fd, size_t bytes, size_t alignment, void** out) noexcept;

int close_fd(int fd) noexcept;
int unmap(void* p, size_t bytes) noexcept;

// madvise: MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_DONTNEED (private memory:
// the range reads as zero afterwards) and MADV_REMOVE (shared memory: frees the
// file's pages too; the range reads as zero afterwards).
int advise_huge(void* p, size_t bytes) noexcept;
int advise_no_huge(void* p, size_t bytes) noexcept;
int advise_dont_need(void* p, size_t bytes) noexcept;
int advise_remove(void* p, size_t bytes) noexcept;
// MADV_POPULATE_WRITE (Linux 5.14): faults the range in, writable, as a write
// would, in one call and without touching the bytes. Older kernels: EINVAL.
int populate_write(void* p, size_t bytes) noexcept;

// mbind(MPOL_BIND) of the range to one NUMA node, through syscall(SYS_mbind)
// (no libnuma). Pages already touched stay where they are: bind before touching.
int bind_to_node(void* p, size_t bytes, int node) noexcept;

}  // namespace ferry::os
