// error.h — ferry's C++ exceptions, one per ferry_status_t.
//
// The OS layer returns errno values; the layers above turn a failure into one of
// these. The C API catches them and turns them back into a status plus the
// thread-local message (capi/last_error). Free and release paths never throw.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "ferry/ferry.h"

namespace ferry {

class Error : public std::runtime_error {
 public:
  Error(ferry_status_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  ferry_status_t status() const noexcept { return status_; }

 private:
  ferry_status_t status_;
};

class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& m) : Error(FERRY_ERROR_INVALID_ARGUMENT, m) {}
};

class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& m) : Error(FERRY_ERROR_OUT_OF_MEMORY, m) {}
};

class NotSupported : public Error {
 public:
  explicit NotSupported(const std::string& m) : Error(FERRY_ERROR_NOT_SUPPORTED, m) {}
};

// A system call failed. what() names the call and the errno text.
class OsError : public Error {
 public:
  OsError(const std::string& call, int err);
  int error_number() const noexcept { return errno_; }

 private:
  int errno_;
};

// A CUDA call failed; code is the cudaError_t value (kept as int so that this
// header needs no CUDA header).
class CudaError : public Error {
 public:
  CudaError(const std::string& m, int code, ferry_status_t s = FERRY_ERROR_CUDA)
      : Error(s, m), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

class NoDevice : public CudaError {
 public:
  NoDevice(const std::string& m, int code) : CudaError(m, code, FERRY_ERROR_NO_DEVICE) {}
};

// "1.5 GiB", "4 KiB", "17 B": sizes in messages.
std::string format_bytes(size_t bytes);

// "0x7f3a2c000000" ("0x0" for NULL): addresses in messages.
std::string format_address(uintptr_t address);
inline std::string format_address(const void* p) { return format_address(reinterpret_cast<uintptr_t>(p)); }

// Text from outside (an environment value, a spec, a file line) as it can be
// quoted in a message: bytes outside printable ASCII as \xNN, at most 200
// characters (then "..."), so a message is never cut at a NUL or garbled.
std::string printable(std::string_view text);

}  // namespace ferry
