// process.h — what /proc says about processes: a process's start time (to
// tell a live pid from one the kernel gave to another process since), this
// boot's id and this process's PID namespace (a pid means something only in
// the same boot and namespace).
//
// The contract of memory.h: every function returns 0 or an errno value, sets
// its outputs only on success, throws nothing and applies no policy.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>

namespace ferry::os {

// Field 22 of /proc/PID/stat (clock ticks after boot); pid 0: this process.
// ESRCH: no such process (its /proc entry is gone). EPROTO: a stat line of
// another shape. EACCES and other errors of /proc as they come.
int process_start_ticks(pid_t pid, uint64_t* ticks_out) noexcept;

// /proc/sys/kernel/random/boot_id, without its newline.
int read_boot_id(std::string* out) noexcept;

// The link /proc/self/ns/pid ("pid:[4026531836]"): this process's PID
// namespace. EXDEV when /proc is of another PID namespace (/proc/self is not
// getpid()): pids read there are not this process's.
int read_pid_namespace(std::string* out) noexcept;

}  // namespace ferry::os
