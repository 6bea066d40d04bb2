// temp_files.h — test support shared by the core and GPU tests of the loader:
// a temporary directory of files filled with random bytes (removed at the
// end, with whatever else a test left in it), and the message of the
// ferry::Error a block throws.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace ferry::test_support {

// Removes `dir` and everything under it, whatever a test made there: FIFOs,
// read-only files, folders without write or search permission (made
// writable first: without that, a user other than root cannot unlink their
// entries). Errors are ignored; tests/CMakeLists.txt's tests_left_no_temp_files
// reports what stays behind.
inline void remove_tree(const std::string& dir) {
  namespace fs = std::filesystem;
  if (dir.empty()) return;
  std::error_code ec;
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec))  // before the iterator enters it
      fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
  }
  fs::remove_all(dir, ec);
}

class TempFiles {
 public:
  // A new directory under `root` (default: $TMPDIR or /tmp), named after the
  // running test (ferry-test-Suite.Name-XXXXXX) so that one left behind says
  // whose it is; ok() is false when it could not be made.
  explicit TempFiles(const char* root = nullptr) {
    std::string base = root ? root : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    std::string name;
    if (const ::testing::TestInfo* me = ::testing::UnitTest::GetInstance()->current_test_info())
      name = (std::string(me->test_suite_name()) + "." + me->name()).substr(0, 120) + "-";
    for (char& c : name)
      if (c == '/') c = '_';  // parameterized tests: Suite/Param.Name/0
    std::string t = base + "/ferry-test-" + name + "XXXXXX";
    dir_ = mkdtemp(t.data()) ? t : "";
  }
  // Removes the directory and all in it (remove_tree).
  ~TempFiles() { remove_tree(dir_); }
  TempFiles(const TempFiles&) = delete;
  TempFiles& operator=(const TempFiles&) = delete;

  bool ok() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

  // A file of `bytes` random bytes; its path and contents are appended to
  // paths and data.
  void add(size_t bytes, std::mt19937_64& rng) {
    std::vector<uint8_t> d(bytes);
    for (size_t i = 0; i < bytes; i += 8) {  // 8 random bytes per draw
      uint64_t r = rng();
      for (size_t k = i; k < bytes && k < i + 8; ++k, r >>= 8) d[k] = static_cast<uint8_t>(r);
    }
    add(d);
  }
  // A file with these bytes.
  std::string add(const std::vector<uint8_t>& bytes, const std::string& name = "") {
    std::string p = dir_ + "/" + (name.empty() ? "f" + std::to_string(paths.size()) + ".bin" : name);
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    paths.push_back(p);
    data.push_back(bytes);
    return p;
  }

  std::vector<std::string> paths;
  std::vector<std::vector<uint8_t>> data;

 private:
  std::string dir_;
};

// The what() of the ferry::Error `body` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace ferry::test_support
