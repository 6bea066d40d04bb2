// unix_socket.cpp — Unix sockets at paths, SCM_RIGHTS, peer credentials and
// fcntl record locks.
#include "os/unix_socket.h"

#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <vector>

namespace ferry::os {
namespace {

static_assert(sizeof(sockaddr_un::sun_path) == kMaxSocketPath + 1);

int path_address(const std::string& path, sockaddr_un* addr, socklen_t* len) {
  if (path.empty() || path.find('\0') != std::string::npos) return EINVAL;
  if (path.size() > kMaxSocketPath) return ENAMETOOLONG;
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path, path.data(), path.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return 0;
}

// A new socket of `type` flags and the address of `path`, for bind or connect.
int socket_for(const std::string& path, int flags, sockaddr_un* addr, socklen_t* len, int* fd_out) {
  if (int err = path_address(path, addr, len)) return err;
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | flags, 0);
  if (fd < 0) return errno;
  *fd_out = fd;
  return 0;
}

int record_lock(int fd, int cmd, short type, off_t at, struct flock* out = nullptr) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = at;
  l.l_len = 1;
  if (::fcntl(fd, cmd, &l) != 0) return errno == EACCES ? EAGAIN : errno;
  if (out) *out = l;
  return 0;
}

}  // namespace

int listen_at(const std::string& path, int* fd_out) noexcept {
  sockaddr_un addr;
  socklen_t len;
  int fd = -1;
  if (int err = socket_for(path, 0, &addr, &len, &fd)) return err;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 64) != 0) {
    const int err = errno;
    ::close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

int connect_at(const std::string& path, int* fd_out) noexcept {
  sockaddr_un addr;
  socklen_t len;
  int fd = -1;
  if (int err = socket_for(path, SOCK_NONBLOCK, &addr, &len, &fd)) return err;
  int rc;
  do rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    ::close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

int peer_credentials(int fd, PeerCredentials* out) noexcept {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return errno;
  out->pid = cred.pid;
  out->uid = cred.uid;
  return 0;
}

int accept_connection(int listen_fd, int* fd_out) noexcept {
  int fd;
  do fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  *fd_out = fd;
  return 0;
}

namespace {

// One message of one buffer with room for one descriptor: what both ends pass.
// Not copyable: msg points into it.
struct FdMessage {
  iovec iov;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  FdMessage(void* data, size_t bytes) : iov{data, bytes} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

}  // namespace

int send_with_fd(int fd, const void* data, size_t bytes, int passed) noexcept {
  FdMessage m(const_cast<void*>(data), bytes);
  msghdr& msg = m.msg;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &passed, sizeof(int));
  ssize_t n;
  do n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) return errno;
  return static_cast<size_t>(n) == bytes ? 0 : EMSGSIZE;
}

int receive_with_fd(int fd, void* data, size_t bytes, size_t* got, int* passed_out) noexcept {
  size_t n = 0;
  int passed = -1;
  bool truncated = false;
  if (const int e = receive_message(fd, data, bytes, &n, &passed, &truncated)) return e;
  if (passed < 0) return n == 0 ? ECONNRESET : EPROTO;
  *got = n;
  *passed_out = passed;
  return 0;
}

int packet_socket_pair(int* first_out, int* second_out) noexcept {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return errno;
  *first_out = fds[0];
  *second_out = fds[1];
  return 0;
}

int send_message(int fd, const void* data, size_t bytes) noexcept {
  ssize_t n;
  do n = ::send(fd, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) return errno;
  return static_cast<size_t>(n) == bytes ? 0 : EMSGSIZE;
}

int receive_message(int fd, void* data, size_t bytes, size_t* got, int* passed_out, bool* truncated_out) noexcept {
  FdMessage m(data, bytes);
  msghdr& msg = m.msg;
  ssize_t n;
  do n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) return errno;
  int passed = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
      std::memcpy(&passed, CMSG_DATA(c), sizeof(int));
  *got = static_cast<size_t>(n);
  *passed_out = passed;
  *truncated_out = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  return 0;
}

namespace {
int poll_ms(int64_t timeout_ns) {
  if (timeout_ns < 0) return -1;
  const int64_t ms = timeout_ns / 1000000 + (timeout_ns % 1000000 != 0);  // never 0 for a wait left
  return static_cast<int>(ms > INT_MAX ? INT_MAX : ms);
}
}  // namespace

int wait_writable(int fd, int64_t timeout_ns) noexcept {
  pollfd p{fd, POLLOUT, 0};
  int rc;
  do rc = ::poll(&p, 1, poll_ms(timeout_ns));
  while (rc < 0 && errno == EINTR);  // a signal: wait again (the caller's deadline bounds the whole)
  if (rc < 0) return errno;
  return rc == 0 ? ETIMEDOUT : 0;
}

int wait_readable(const int* fds, size_t count, int64_t timeout_ns, size_t* ready_out) noexcept {
  std::vector<pollfd> p(count);
  for (size_t i = 0; i < count; ++i) p[i] = pollfd{fds[i], POLLIN, 0};
  int64_t ms = -1;
  if (timeout_ns >= 0) ms = timeout_ns / 1000000 + (timeout_ns % 1000000 != 0);  // never 0 for a wait left
  const int rc = ::poll(p.data(), count, static_cast<int>(ms > INT_MAX ? INT_MAX : ms));
  if (rc < 0) return errno;
  for (size_t i = 0; i < count; ++i)
    if (p[i].revents) {
      *ready_out = i;
      return 0;
    }
  return ETIMEDOUT;
}

int shutdown_socket(int fd) noexcept { return ::shutdown(fd, SHUT_RDWR) == 0 ? 0 : errno; }

int remove_socket_file(const std::string& path) noexcept {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno;
  if (!S_ISSOCK(st.st_mode)) return ENOTSOCK;
  return ::unlink(path.c_str()) == 0 ? 0 : errno;
}

int descriptor_owner(int fd, uid_t* uid_out) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno;
  *uid_out = st.st_uid;
  return 0;
}

int lock_byte(int fd, off_t at) noexcept { return record_lock(fd, F_SETLK, F_WRLCK, at); }
int unlock_byte(int fd, off_t at) noexcept { return record_lock(fd, F_SETLK, F_UNLCK, at); }

int byte_locked_by_other(int fd, off_t at, bool* locked_out) noexcept {
  struct flock l {};
  if (int err = record_lock(fd, F_GETLK, F_WRLCK, at, &l)) return err;
  *locked_out = l.l_type != F_UNLCK;
  return 0;
}

}  // namespace ferry::os
