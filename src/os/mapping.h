// mapping.h — questions about the caller's address space that the copy engine
// asks before it touches a user buffer from its own threads.
#pragma once

#include <cstddef>

namespace ferry::os {

// 0 when every page of [p, p+bytes) is mapped; ENOMEM when some is not
// (msync's answer; it walks the mappings without touching the pages).
int range_is_mapped(const void* p, size_t bytes) noexcept;

}  // namespace ferry::os
