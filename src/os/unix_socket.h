// unix_socket.h — Unix sockets bound to paths that pass a file descriptor
// (SCM_RIGHTS) between processes of one node, the credentials of the process
// at the other end, and POSIX record locks that mark a process alive.
//
// Why paths, not abstract names: an abstract name has no permissions. Any
// process of the network namespace, of any user, may bind any name first or
// connect to it, so another user could serve a pool's name or stall its opens
// (issue 38). A path lives in a directory whose permissions decide who may
// bind and connect there (os/private_dir.h). A path outlives its socket: a
// dead process leaves a file that refuses connections (ECONNREFUSED), which
// whoever binds the path next removes first.
//
// Nothing here waits: connect, send and receive are non-blocking, and
// wait_readable is the one bounded wait, so a caller bounds every step of a
// conversation by its own deadline.
//
// The contract of memory.h: every function returns 0 or an errno value, sets
// its outputs only on success, throws nothing and applies no policy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/types.h>

namespace ferry::os {

// The longest socket path (sun_path is 108 bytes, one is the final NUL).
constexpr size_t kMaxSocketPath = 107;

// socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC), bound to `path` and
// listening. EADDRINUSE: a file already holds the path (a stale socket too:
// remove_socket_file first). ENAMETOOLONG: longer than kMaxSocketPath.
int listen_at(const std::string& path, int* fd_out) noexcept;

// A non-blocking connection to the socket at `path` (SOCK_SEQPACKET |
// SOCK_CLOEXEC | SOCK_NONBLOCK). Never waits: ENOENT, no file; ECONNREFUSED,
// nobody listens there (a stale file); EAGAIN, the listener's backlog is full
// (it does not accept: stopped, or busy); EACCES, no permission.
int connect_at(const std::string& path, int* fd_out) noexcept;

// The process at the other end of a connected socket, as it was when it
// called listen() or connect() (SO_PEERCRED): its pid and effective uid.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
};
int peer_credentials(int fd, PeerCredentials* out) noexcept;

// accept4(SOCK_CLOEXEC | SOCK_NONBLOCK), retrying EINTR. EINVAL once the
// socket was shut down; EMFILE/ENFILE/ENOBUFS/ENOMEM: out of resources (the
// connection stays in the backlog for a later accept).
int accept_connection(int listen_fd, int* fd_out) noexcept;

// One message of `bytes` with descriptor `passed` attached (SCM_RIGHTS),
// never waiting (EAGAIN when the peer's queue is full).
int send_with_fd(int fd, const void* data, size_t bytes, int passed) noexcept;

// Receives one message of at most `bytes` and the descriptor attached to it
// (made close-on-exec), never waiting: EAGAIN when nothing has arrived.
// ECONNRESET: the peer closed without a message. EPROTO: a message came with
// no descriptor. *got: bytes read.
int receive_with_fd(int fd, void* data, size_t bytes, size_t* got, int* passed_out) noexcept;

// socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC): two connected ends,
// blocking (the sends and receives below never wait anyway), for a parent
// and the child it starts.
int packet_socket_pair(int* first_out, int* second_out) noexcept;

// One message of `bytes` with no descriptor, never waiting (EAGAIN when the
// peer's queue is full; EPIPE once the peer closed, ECONNRESET if it closed
// with messages unread).
int send_message(int fd, const void* data, size_t bytes) noexcept;

// Receives one message of at most `bytes`, with or without a descriptor,
// never waiting (EAGAIN when nothing has arrived). *passed_out: the
// descriptor attached (close-on-exec), -1 for none. *truncated_out: the
// message was longer than `bytes`, or carried more than one descriptor (the
// kernel closes those that did not fit). *got 0 with no descriptor: the peer
// closed its end (or sent an empty message, which callers never do).
int receive_message(int fd, void* data, size_t bytes, size_t* got, int* passed_out, bool* truncated_out) noexcept;

// poll() until fd can take a message, waiting at most timeout_ns (negative:
// no limit). ETIMEDOUT: it could not by then; a hung-up peer counts as
// writable (the send then says EPIPE).
int wait_writable(int fd, int64_t timeout_ns) noexcept;

// poll() for the first of fds[0..count) that has something to read, or was
// hung up or failed (a receive then tells which), waiting at most timeout_ns
// (negative: no limit). *ready_out: its index. ETIMEDOUT: none by then.
int wait_readable(const int* fds, size_t count, int64_t timeout_ns, size_t* ready_out) noexcept;

// shutdown(SHUT_RDWR): wakes a thread blocked in accept_connection on it.
int shutdown_socket(int fd) noexcept;

// Removes the socket file at `path` (unlink). ENOENT: none; ENOTSOCK: the
// path holds something else (left in place).
int remove_socket_file(const std::string& path) noexcept;

// The owner (st_uid) of the file behind descriptor fd: of a descriptor that
// another process passed, who made it.
int descriptor_owner(int fd, uid_t* uid_out) noexcept;

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
