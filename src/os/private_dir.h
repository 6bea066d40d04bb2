// private_dir.h — a directory that only this user can reach, and the files in
// it: where the processes of a node find each other (node/node_dir.h). The
// tmux model: a socket directory per user, made 0700, checked with lstat
// before use.
//
// The contract of memory.h: every function returns 0 or an errno value, sets
// its outputs only on success, throws nothing and applies no policy (whether a
// directory is private enough is the caller's decision, from PathFacts).
#pragma once

#include <string>
#include <sys/types.h>
#include <vector>

namespace ferry::os {

// What lstat says of a path (a symbolic link is not followed).
struct PathFacts {
  bool is_directory = false;
  bool is_symlink = false;
  uid_t owner = 0;
  unsigned mode = 0;  // the permission bits (07777)
};

// lstat(path). ENOENT: nothing there.
int path_facts(const std::string& path, PathFacts* out) noexcept;

// mkdir(path, mode), then chmod(path, mode) so that the umask does not
// decide. EEXIST: something is there already (left as it is).
int make_directory(const std::string& path, unsigned mode) noexcept;

// open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600): a lock file,
// made if absent (ELOOP: the path is a symbolic link).
int open_lock_file(const std::string& path, int* fd_out) noexcept;

// Whether `path` still names the file open at fd (same device and inode;
// lstat). false when the path is gone or names another file.
int names_file(int fd, const std::string& path, bool* same_out) noexcept;

// unlink(path).
int remove_file(const std::string& path) noexcept;

// The names in directory `path` (readdir; not "." and ".."). ENOMEM when the
// list cannot grow.
int list_directory(const std::string& path, std::vector<std::string>* names_out) noexcept;

}  // namespace ferry::os
