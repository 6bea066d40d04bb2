// range_read.h — one range of a file read into memory by several threads:
// the reader of node loads (node/node_file.h reads
// each rank's share of a file piece by piece through it), on the OS layer's pread
// loop (os/file.h: EINTR retried, partial reads continued).
//
// The range is cut into chunks (at least 1 MiB, at most 32 MiB, about one per
// thread) taken in file order by `threads` threads, the caller's among them.
// The first failed read stops the others at their next chunk; read_range
// returns once every thread has.
//
// Locking: Reads::mu (range_read.cpp) guards the first error only; the next
// chunk and the file's end seen are atomics. No lock is held across a read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry::load {

inline constexpr int kMaxRangeReadThreads = 64;

// Reads [offset, offset + bytes) of descriptor fd into `destination`.
// Returns the bytes read: `bytes`, or fewer where the file ends inside the
// range (those before its end; the caller decides whether a short file is an
// error). Throws OsError whose message names `name`, the byte and the call
// for a failed read (EBADF, EIO, ...). threads: 1 .. kMaxRangeReadThreads.
size_t read_range(int fd, const std::string& name, uint64_t offset, void* destination, size_t bytes, int threads);

}  // namespace ferry::load
