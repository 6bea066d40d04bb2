// profile_file.cpp — finding and reading the machine profile (profile_file.h).
#include "copy/profile_file.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/options.h"
#include "os/sysfs.h"

namespace ferry {

namespace {

// A profile is a few hundred bytes; this bounds the read (FERRY_PROFILE=/dev/zero
// read without end), and read_file refuses a directory, a FIFO or a device.
constexpr size_t kMaxProfileBytes = size_t{64} << 10;

}  // namespace

std::string profile_file_path(bool* named) {
  std::string path = ferry::options().text("FERRY_PROFILE");
  *named = !path.empty();
  if (path.empty()) {
    const char* cache = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    if (cache && *cache) path = std::string(cache) + "/ferry/profile.txt";
    else if (home && *home) path = std::string(home) + "/.cache/ferry/profile.txt";
  }
  return path;
}

MachineProfile load_machine_profile() {
  bool named = false;
  const std::string path = profile_file_path(&named);
  if (path.empty()) return MachineProfile::defaults();
  std::string text;
  const int err = os::read_file(path.c_str(), &text, kMaxProfileBytes);
  if (err == ENOENT && !named) return MachineProfile::defaults();  // no calibration yet
  if (err) {
    const std::string why = err == E2BIG    ? "larger than 64 KiB, not a profile"
                            : err == EISDIR ? "a directory, not a profile"
                            : err == EINVAL ? "not a regular file"
                                            : std::strerror(err);
    throw InvalidArgument((named ? "FERRY_PROFILE='" + path + "'" : path) + ": cannot read the profile: " + why);
  }
  try {
    return parse_profile(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(path + ": " + e.what() + " (run `ferry bench copy --calibrate` to rewrite it)");
  }
}

}  // namespace ferry
