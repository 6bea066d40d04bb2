// unix_socket.cpp — abstract Unix sockets, SCM_RIGHTS and fcntl record locks.
#include "os/unix_socket.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

namespace ferry::os {
namespace {

int abstract_address(const std::string& name, sockaddr_un* addr, socklen_t* len) {
  if (name.empty() || name.size() > kMaxSocketName) return ENAMETOOLONG;
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path + 1, name.data(), name.size());  // sun_path[0] = '\0': abstract
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return 0;
}

int new_socket(int* fd_out) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
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

// A new socket and the abstract address of `name`, for bind or connect.
int socket_for(const std::string& name, sockaddr_un* addr, socklen_t* len, int* fd_out) {
  if (int err = abstract_address(name, addr, len)) return err;
  return new_socket(fd_out);
}

}  // namespace

int listen_abstract(const std::string& name, int* fd_out) noexcept {
  sockaddr_un addr;
  socklen_t len;
  int fd = -1;
  if (int err = socket_for(name, &addr, &len, &fd)) return err;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 64) != 0) {
    const int err = errno;
    ::close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

int connect_abstract(const std::string& name, int* fd_out) noexcept {
  sockaddr_un addr;
  socklen_t len;
  int fd = -1;
  if (int err = socket_for(name, &addr, &len, &fd)) return err;
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

int set_receive_timeout(int fd, int ms) noexcept {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  return ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 ? 0 : errno;
}

int accept_connection(int listen_fd, int* fd_out) noexcept {
  int fd;
  do fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  *fd_out = fd;
  return 0;
}

int peer_uid(int fd, uid_t* uid_out) noexcept {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return errno;
  *uid_out = cred.uid;
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
  do n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0) return errno;
  return static_cast<size_t>(n) == bytes ? 0 : EMSGSIZE;
}

int receive_with_fd(int fd, void* data, size_t bytes, size_t* got, int* passed_out) noexcept {
  FdMessage m(data, bytes);
  msghdr& msg = m.msg;
  ssize_t n;
  do n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) return errno;
  int passed = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
      std::memcpy(&passed, CMSG_DATA(c), sizeof(int));
  if (passed < 0) return EPROTO;
  *got = static_cast<size_t>(n);
  *passed_out = passed;
  return 0;
}

int shutdown_socket(int fd) noexcept { return ::shutdown(fd, SHUT_RDWR) == 0 ? 0 : errno; }

int lock_byte(int fd, off_t at) noexcept { return record_lock(fd, F_SETLK, F_WRLCK, at); }
int unlock_byte(int fd, off_t at) noexcept { return record_lock(fd, F_SETLK, F_UNLCK, at); }

int byte_locked_by_other(int fd, off_t at, bool* locked_out) noexcept {
  struct flock l {};
  if (int err = record_lock(fd, F_GETLK, F_WRLCK, at, &l)) return err;
  *locked_out = l.l_type != F_UNLCK;
  return 0;
}

}  // namespace ferry::os
