// unix_socket.h — abstract-namespace Unix sockets that pass a file descriptor
// (SCM_RIGHTS) between processes of one node, and POSIX record locks that
// mark a process alive.
//
// Why abstract names: they need no file (no /dev/shm, no /tmp entry to clean
// up) and vanish with the socket, so a dead process leaves no name behind.
// They are scoped to the network namespace: processes of one container (one
// pod) see each other, others do not.
//
// The contract of memory.h: every function returns 0 or an errno value, sets
// its outputs only on success, throws nothing and applies no policy.
#pragma once

#include <cstddef>
#include <string>
#include <sys/types.h>

namespace ferry::os {

// The longest abstract name (sun_path is 108 bytes, one is the leading NUL).
constexpr size_t kMaxSocketName = 107;

// socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC), bound to the abstract name
// `name` and listening. EADDRINUSE: another socket holds the name.
int listen_abstract(const std::string& name, int* fd_out) noexcept;

// Connects to the abstract name. ECONNREFUSED: nobody listens there.
int connect_abstract(const std::string& name, int* fd_out) noexcept;

// SO_RCVTIMEO: a receive on fd fails with EAGAIN after `ms` milliseconds.
int set_receive_timeout(int fd, int ms) noexcept;

// accept4(SOCK_CLOEXEC), retrying EINTR. EINVAL once the socket was shut down.
int accept_connection(int listen_fd, int* fd_out) noexcept;

// The effective uid of the process at the other end (SO_PEERCRED).
int peer_uid(int fd, uid_t* uid_out) noexcept;

// One message of `bytes` with descriptor `passed` attached (SCM_RIGHTS).
int send_with_fd(int fd, const void* data, size_t bytes, int passed) noexcept;

// Receives one message of at most `bytes` and the descriptor attached to it
// (made close-on-exec). EPROTO: no descriptor came with it. *got: bytes read.
int receive_with_fd(int fd, void* data, size_t bytes, size_t* got, int* passed_out) noexcept;

// shutdown(SHUT_RDWR): wakes a thread blocked in accept_connection on it.
int shutdown_socket(int fd) noexcept;

// A POSIX (fcntl F_SETLK) write lock on byte `at` of file fd, held by this
// process until it unlocks, closes ANY descriptor of that file, or dies
// (SIGKILL included); a forked child does not inherit it. EAGAIN: another
// process holds it.
int lock_byte(int fd, off_t at) noexcept;
int unlock_byte(int fd, off_t at) noexcept;

// Whether another process holds the lock on byte `at` (F_GETLK); the caller's
// own locks never count.
int byte_locked_by_other(int fd, off_t at, bool* locked_out) noexcept;

}  // namespace ferry::os
