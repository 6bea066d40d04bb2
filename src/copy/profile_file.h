// profile_file.h — where the machine profile (copy/strategy.h) lives on disk
// and reading it: FERRY_PROFILE names the file, else
// $XDG_CACHE_HOME/ferry/profile.txt, else $HOME/.cache/ferry/profile.txt (the
// file `ferry bench copy --calibrate` writes: the bench and `ferry doctor` ask
// profile_file_path() through the Python binding, ferry._ferry.profile_file_path,
// in python/ferry/facts/copy_engine.py's profile_path()).
#pragma once

#include <string>

#include "copy/strategy.h"

namespace ferry {

// The path by the rule above; "" when none of the variables is set.
// *named is set to whether FERRY_PROFILE named it.
std::string profile_file_path(bool* named);

// The profile from that file; the built-in defaults when there is no file
// (unless FERRY_PROFILE named it). Throws InvalidArgument naming the file for
// a bad line, or a file that cannot be read, is over 64 KiB or is not a
// regular file.
MachineProfile load_machine_profile();

}  // namespace ferry
