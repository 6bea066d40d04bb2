// temp_files.h — test support shared by the core and GPU tests of the loader:
// a temporary directory of files filled with random bytes (removed at the
// end), and the message of the ferry::Error a block throws.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace ferry::test_support {

class TempFiles {
 public:
  // A new directory under `root` (default: $TMPDIR or /tmp); ok() is false
  // when it could not be made.
  explicit TempFiles(const char* root = nullptr) {
    std::string base = root ? root : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    std::string t = base + "/ferry-test-XXXXXX";
    dir_ = mkdtemp(t.data()) ? t : "";
  }
  ~TempFiles() {
    for (auto& p : paths) std::remove(p.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
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
