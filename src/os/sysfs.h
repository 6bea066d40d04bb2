// sysfs.h — small facts from sysfs and procfs: THP settings, free hugetlb
// pages, usable cores, NUMA nodes and their CPUs, a PCI device's node.
//
// Readers return 0 or an errno value and set their output only on success.
// Parsers are pure functions of the text (unit-tested on samples); they never
// throw on bad input but report it through their return value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::os {

// Reads a whole small regular file (at most max_bytes; more is E2BIG). A
// directory is EISDIR; anything else that is not a regular file (a FIFO, a
// device: /dev/zero never ends) is EINVAL, without reading or waiting.
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
// free_hugepages less resv_hugepages: the pages a new mapping can still
// reserve (free counts pages other shared mappings reserved but not faulted).
int read_unreserved_hugepages(size_t page_bytes, uint64_t* out);

// CPUs this thread may run on (sched_getaffinity), at least 1.
int usable_cores() noexcept;

// The number of CPUs in `cpus`, or usable_cores() when it is empty (no binding).
inline int cpus_or_usable(const std::vector<int>& cpus) noexcept {
  return cpus.empty() ? usable_cores() : static_cast<int>(cpus.size());
}

// Largest CPU or node id a cpulist may name (the kernel's NR_CPUS is at most
// 8192 today); the bound keeps "0-20000000" from expanding 20 million ids.
constexpr int kMaxCpuId = (1 << 16) - 1;

// A Linux cpulist ("0-3,8,10-11", the stride form "0-31:2/4": in each group of
// 4 ids from 0, the first 2) as sorted distinct ids; blank text is the empty
// list (a node without CPUs). Also python/ferry's one cpulist parser
// (src/python/sysfs_bindings.cpp); false for anything else, an id above
// kMaxCpuId or ranges that add up to more than 2^17 ids.
bool parse_cpulist(std::string_view text, std::vector<int>* out);

// A PCI address as sysfs names it: "00000000:0A:00.0" (CUDA's form) or
// "0a:00.0" -> "0000:0a:00.0"; "" when the text is not a PCI address.
std::string normalize_pci_bus_id(std::string_view bus_id);

// A sysfs numa_node value: -1 (the firmware names no node) or 0 .. kMaxCpuId.
bool parse_numa_node(std::string_view text, int* out);

// Online NUMA node ids (/sys/devices/system/node/online). A kernel without
// NUMA has no such file: ENOENT.
int read_online_nodes(std::vector<int>* nodes);

// CPUs of one node (/sys/devices/system/node/node<N>/cpulist).
int read_node_cpus(int node, std::vector<int>* cpus);

// numa_node of the PCI device at `bus_id` (any form normalize_pci_bus_id
// takes): -1 when the firmware names none. EINVAL for a bus id that is not a
// PCI address or an unparseable file, ENOENT when there is no such device.
int read_pci_numa_node(std::string_view bus_id, int* node);

// The machine's physical memory in bytes (sysconf), 0 when unknown.
uint64_t physical_memory_bytes() noexcept;

}  // namespace ferry::os
