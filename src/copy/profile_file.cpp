// profile_file.cpp — finding and reading the machine profile (profile_file.h).
#include "copy/profile_file.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/options.h"

namespace ferry {

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
  std::ifstream in(path);
  if (!in) {
    if (named) throw InvalidArgument("FERRY_PROFILE='" + path + "': cannot read the file");
    return MachineProfile::defaults();
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    return parse_profile(text.str());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(path + ": " + e.what() + " (run `ferry bench copy --calibrate` to rewrite it)");
  }
}

}  // namespace ferry
