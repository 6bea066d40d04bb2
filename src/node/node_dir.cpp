// node_dir.cpp — the private directory of node pools and the names in it.
#include "node/node_dir.h"

#include <cerrno>
#include <cstdio>
#include <unistd.h>

#include "core/error.h"
#include "core/options.h"
#include "node/node_region.h"
#include "os/private_dir.h"
#include "os/unix_socket.h"

namespace ferry::node {
namespace {

std::string octal(unsigned mode) {
  char text[8];
  std::snprintf(text, sizeof text, "0%03o", mode & 0777);
  return text;
}

// Why `facts` of `dir` do not make a private directory of this user ("" if they do).
std::string not_private(const os::PathFacts& facts) {
  if (facts.is_symlink) return "it is a symbolic link";
  if (!facts.is_directory) return "it is not a directory";
  if (facts.owner != geteuid())
    return "it belongs to uid " + std::to_string(facts.owner) + ", not to this process's " +
           std::to_string(geteuid());
  if (facts.mode & 077) return "its mode " + octal(facts.mode) + " lets group or others in (0700 is asked)";
  return "";
}

}  // namespace

std::string private_node_dir(const std::string& configured, const std::string& name) {
  std::string dir = configured;
  const char* source = "NodePoolOptions::dir";
  if (dir.empty()) {
    dir = options().text("FERRY_NODE_DIR");
    source = "FERRY_NODE_DIR";
  }
  if (dir.empty()) {
    dir = "/tmp/ferry-" + std::to_string(geteuid());
    source = "the default";
  }
  if (dir[0] != '/')
    throw InvalidArgument("node pool '" + name + "': its directory '" + printable(dir) + "' (" + source +
                          ") must be an absolute path (processes started elsewhere would look elsewhere)");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string longest = member_socket_path(dir, name, kMaxMembers - 1);
  if (longest.size() > os::kMaxSocketPath)
    throw InvalidArgument("node pool '" + name + "': its socket paths in '" + printable(dir) + "' (" + source +
                          ") take up to " + std::to_string(longest.size()) + " bytes, over the " +
                          std::to_string(os::kMaxSocketPath) +
                          " a Unix socket path may have: set FERRY_NODE_DIR to a shorter directory");
  const int made = os::make_directory(dir, 0700);
  if (made != 0 && made != EEXIST)
    throw OsError("node pool '" + name + "': mkdir of its directory '" + printable(dir) + "' (" + source + ")", made);
  os::PathFacts facts;
  if (int err = os::path_facts(dir, &facts))
    throw OsError("node pool '" + name + "': lstat of its directory '" + printable(dir) + "'", err);
  if (const std::string why = not_private(facts); !why.empty())
    throw OsError("node pool '" + name + "': '" + printable(dir) + "' (" + source + ") is not a private directory: " +
                      why + ". Node pools meet there, where no other user may bind or connect a socket; remove it "
                      "if it is a stale one, or set FERRY_NODE_DIR to a directory of your own with mode 0700; open",
                  EACCES);
  return dir;
}

std::string open_lock_path(const std::string& dir, const std::string& name) { return dir + "/" + name + ".lock"; }

std::string member_socket_path(const std::string& dir, const std::string& name, uint32_t slot) {
  return dir + "/" + name + "." + std::to_string(slot);
}

}  // namespace ferry::node
