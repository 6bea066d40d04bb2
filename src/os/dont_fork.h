// dont_fork.h — memory a fork() does not copy, and what a forked child finds
// in its place.
//
// Why: since Linux 5.9 a page of private anonymous memory that is pinned for
// DMA (cudaHostRegister, RDMA, io_uring fixed buffers: FOLL_PIN) cannot be
// shared copy-on-write, so fork() copies every such page into the child, at
// fork time. ferry's pinned chunks are such memory: holding 2 GiB of them, one
// os.fork() took 1.3 s and the child held a private 2 GiB copy (H100 machine,
// issue 29), where PyTorch's cudaHostAlloc memory (the driver maps it shared)
// cost 13 ms and nothing. MADV_DONTFORK leaves a range out of every child
// (VmFlags "dc"; what ibverbs does for registered memory): fork() then costs
// what it costs without the range.
//
// What a child finds there: a "tombstone", a PROT_NONE reservation of the
// range (no memory behind it) made in the child inside fork(), so that
// nothing the child maps later lands at an address the parent's pointers name
// (a stale pointer would then read another mapping's bytes, silently). A touch
// is a SIGSEGV; a handler installed in the child (only where it has
// tombstones) writes one line to stderr saying that the address was ferry's
// pinned memory of the parent and what to do instead, then hands the fault to
// the handler that was there before it (Python's faulthandler, a sanitizer, or
// the default action: the process dies of SIGSEGV). Never silent zeros,
// never another allocation's data.
//
// A child that wants to read memory of its parent uses memory made to be
// shared: a memfd-backed pool (MAP_SHARED, VmFlags "sh": the child maps the
// same pages; no copy either).
//
// Locking: a mutex of this file guards the hidden ranges; it is held across
// fork() (core/fork.h) and never across a system call other than madvise.
// The tombstones of a child are written once, inside fork(), and only read
// after (by the signal handler): no lock.
#pragma once

#include <cstddef>

namespace ferry::os {

// madvise(MADV_DONTFORK) over [p, p + bytes) and remembers the range, so that
// a forked child gets a tombstone there. 0 or an errno (EINVAL from madvise,
// ENOMEM when the range cannot be remembered: then the advice is undone).
// Preconditions: the range is mapped, page aligned, and not hidden already.
int hide_from_fork(void* p, size_t bytes) noexcept;

// Forgets the hidden range that starts at p, before it is unmapped; nothing
// for an address that starts none.
void forget_hidden(void* p) noexcept;

// The number of ranges hidden now (tests).
size_t hidden_range_count() noexcept;

// In a forked child: whether p lies in a tombstone made at its fork (tests,
// and the signal handler).
bool in_tombstone(const void* p) noexcept;

}  // namespace ferry::os
