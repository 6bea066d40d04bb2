// node_dir.h — where the processes of one node find a pool by name: a
// directory of this user's own (the tmux model), and in it, per pool:
//
//   <name>.lock     the open lock: a POSIX record lock on its byte 0, held by
//                   one opening process from its first look at the members
//                   until it serves the pool, or gives up (node_pool.cpp)
//   <name>.<slot>   the Unix socket (SOCK_SEQPACKET) of the member in that
//                   slot of the region, which hands out the region's memfd
//
// Why a directory: abstract socket names have no permissions, so another
// user could serve a pool's name first or stall its opens (issue 38). Here
// only this user may bind, connect or create a file: the directory is this
// effective uid's, mode 0700, checked with lstat (not a symbolic link)
// before every open. Which directory: NodePoolOptions::dir, else
// FERRY_NODE_DIR, else /tmp/ferry-<euid> (made on first use). Processes find
// each other when they see the same directory (one mount namespace, or a
// volume they share) and run as the same user.
//
// A member killed with SIGKILL leaves its socket file; a look at the members
// finds it stale (ECONNREFUSED) and removes it. The last member to leave
// removes the lock file, and so does an open that fails with no pool alive;
// the creator of a pool sweeps what dead pools of other names left (each
// under that name's lock). The directory stays.
#pragma once

#include <cstdint>
#include <string>

namespace ferry::node {

// The directory for the pool `name` (see above), made (mode 0700) if absent.
// Throws OsError(EACCES) saying why and what to do unless it is a directory,
// not a symbolic link, owned by this effective uid, with no permission for
// group or others; OsError when it cannot be made (its parent missing);
// InvalidArgument when a socket path of `name` in it would not fit a Unix
// socket address (107 bytes).
std::string private_node_dir(const std::string& configured, const std::string& name);

std::string open_lock_path(const std::string& dir, const std::string& name);
std::string member_socket_path(const std::string& dir, const std::string& name, uint32_t slot);

}  // namespace ferry::node
