// smaps.h — what /proc/self/smaps says about an address range: resident
// bytes, THP and hugetlb backing, the THP advice flags.
//
// parse_smaps() is pure (tested on sample text). A mapping counts when it
// overlaps the range; smaps reports whole mappings, and the kernel may have
// merged a chunk with an adjacent mapping of the same flags, so totals are of
// the overlapping mappings, not clipped to the range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::os {

struct SmapsTotals {
  size_t mappings = 0;             // mappings that overlap the range
  uint64_t size_bytes = 0;         // Size
  uint64_t rss_bytes = 0;          // Rss
  uint64_t anon_huge_bytes = 0;    // AnonHugePages
  uint64_t pmd_mapped_bytes = 0;   // ShmemPmdMapped + FilePmdMapped
  uint64_t hugetlb_bytes = 0;      // Shared_Hugetlb + Private_Hugetlb
  uint64_t kernel_page_bytes = 0;  // largest KernelPageSize
  bool thp_eligible = false;       // at least one mapping, and all say THPeligible: 1
  bool advised_huge = false;       // some mapping has VmFlags "hg" (MADV_HUGEPAGE)
  bool advised_no_huge = false;    // some mapping has VmFlags "nh" (MADV_NOHUGEPAGE)
  size_t dont_fork_mappings = 0;   // mappings with VmFlags "dc" (MADV_DONTFORK: not in a forked child)
  size_t shared_mappings = 0;      // mappings with VmFlags "sh" (MAP_SHARED: a child shares the pages)
  // Whether fork() copies none of the range's pages: every mapping is left
  // out of the child or shared with it (os/dont_fork.h).
  bool fork_copies_nothing() const { return mappings > 0 && dont_fork_mappings + shared_mappings >= mappings; }
};

// Sums the mappings of `smaps_text` that overlap [begin, end). Lines it does
// not understand are skipped.
SmapsTotals parse_smaps(std::string_view smaps_text, uintptr_t begin, uintptr_t end);

// Reads /proc/self/smaps. Returns 0 or an errno value.
int read_smaps(std::string* out);

}  // namespace ferry::os
