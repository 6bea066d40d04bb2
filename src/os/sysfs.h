// sysfs.h — small facts from sysfs and procfs: THP settings, free hugetlb
// pages, usable cores.
//
// Readers return 0 or an errno value and set their output only on success.
// Parsers are pure functions of the text (unit-tested on samples); they never
// throw on bad input but report it through their return value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::os {

// Reads a whole small file (at most max_bytes; more is E2BIG).
int read_file(const char* path, std::string* out, size_t max_bytes = size_t{1} << 16);

// The selected value of a THP setting: "always [madvise] never" -> "madvise".
// A file holding one bare word is that word. Empty, several selections or
// several words with none selected -> "" (unknown).
std::string parse_thp_setting(std::string_view text);

// An unsigned decimal integer, surrounding white space allowed ("16\n").
bool parse_unsigned(std::string_view text, uint64_t* out);

// /sys/kernel/mm/transparent_hugepage/{enabled,shmem_enabled}, parsed. An
// unparseable file is EINVAL.
int read_thp_enabled(std::string* setting);
int read_thp_shmem_enabled(std::string* setting);

// Directory of the hugetlb pool for a page size:
// 2 MiB -> "/sys/kernel/mm/hugepages/hugepages-2048kB".
std::string hugepages_dir(size_t page_bytes);

// free_hugepages of that pool (ENOENT when the kernel has no such pool).
int read_free_hugepages(size_t page_bytes, uint64_t* out);

// CPUs this thread may run on (sched_getaffinity), at least 1.
int usable_cores() noexcept;

// The machine's physical memory in bytes (sysconf), 0 when unknown.
uint64_t physical_memory_bytes() noexcept;

}  // namespace ferry::os
