// args.h — checked conversions of Python arguments for the bindings.
//
// An argument of the wrong type or out of range raises InvalidArgumentError
// naming the argument and quoting its repr ("limit_bytes=-1: expected a byte
// count, an integer >= 0"), never nanobind's "incompatible function arguments"
// nor std::bad_cast. A bool is not a number here (alloc(True) is a mistake,
// not one byte), nor is a float (1.5 bytes, or 2.0, is refused) nor a string;
// objects with __index__ (numpy integers) are integers. The layers below check
// what the values mean (python/ferry/_args.py does the same for the Python
// wrappers; C++ PoolOptions::validate() checks the pool's ranges).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "core/error.h"

namespace ferry::python {

// repr(value), shortened to 80 characters.
inline std::string arg_repr(nanobind::handle value) {
  std::string r = nanobind::cast<std::string>(nanobind::repr(value));
  return r.size() > 80 ? r.substr(0, 77) + "..." : r;
}

// value as a Python int, or InvalidArgument saying what was expected.
inline nanobind::object checked_index(nanobind::handle value, const char* name, const char* expected) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": expected " + expected +
                          (PyBool_Check(value.ptr()) ? " (a bool is not a number)" : ""));
  PyObject* index = PyNumber_Index(value.ptr());
  if (!index) throw nanobind::python_error();
  return nanobind::steal(index);
}

// An integer in [lo, hi] of type T (the field it fills).
template <class T>
T int_arg(nanobind::handle value, const char* name, T lo = std::numeric_limits<T>::min(),
          T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  const std::string range = std::to_string(lo) + " .. " + std::to_string(hi);
  nanobind::object index = checked_index(value, name, ("an integer " + range).c_str());
  bool in_range = false;
  T out = 0;
  if constexpr (std::is_signed_v<T>) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    in_range = overflow == 0 && v >= static_cast<long long>(lo) && v <= static_cast<long long>(hi);
    out = static_cast<T>(v);
  } else {
    if (PyObject_RichCompareBool(index.ptr(), nanobind::int_(0).ptr(), Py_GE) == 1) {
      const unsigned long long v = PyLong_AsUnsignedLongLong(index.ptr());
      if (PyErr_Occurred()) PyErr_Clear();  // OverflowError: above 2**64 - 1
      else in_range = v >= static_cast<unsigned long long>(lo) && v <= static_cast<unsigned long long>(hi);
      out = static_cast<T>(v);
    }
  }
  if (!in_range)
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": out of range (expected an integer " +
                          range + ")");
  return out;
}

// A byte count: an integer 0 .. 2**64 - 1. A plain int (the hot path of
// Pool.alloc) costs one conversion; anything else takes the checked way.
inline size_t size_arg(nanobind::handle value, const char* name) {
  if (PyLong_CheckExact(value.ptr())) {
    const unsigned long long v = PyLong_AsUnsignedLongLong(value.ptr());
    if (!(v == static_cast<unsigned long long>(-1) && PyErr_Occurred())) return static_cast<size_t>(v);
    PyErr_Clear();  // negative, or above 2**64 - 1: said below
  }
  nanobind::object index = checked_index(value, name, "a byte count, an integer >= 0");
  if (PyObject_RichCompareBool(index.ptr(), nanobind::int_(0).ptr(), Py_LT) == 1)
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) +
                          ": expected a byte count, an integer >= 0");
  return int_arg<size_t>(index, name);
}

// True or False, nothing else ("yes", 1 and None are mistakes).
inline bool bool_arg(nanobind::handle value, const char* name) {
  if (!PyBool_Check(value.ptr()))
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": expected True or False");
  return value.ptr() == Py_True;
}

// A str argument.
inline std::string str_arg(nanobind::handle value, const char* name) {
  if (!PyUnicode_Check(value.ptr()))
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": expected a string");
  return nanobind::cast<std::string>(value);
}

// A real number in [lo, hi]: an int or a float (not a bool, not NaN).
inline double real_arg(nanobind::handle value, const char* name, double lo, double hi) {
  const bool number = !PyBool_Check(value.ptr()) && (PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr()));
  const double v = number ? PyFloat_AsDouble(value.ptr()) : 0.0;
  if (number && v == -1.0 && PyErr_Occurred()) PyErr_Clear();  // an int too large for a double
  else if (number && v >= lo && v <= hi) return v;
  throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": expected a number " + std::to_string(lo) +
                        " .. " + std::to_string(hi));
}

// A file path as the OS takes it: a str (encoded as os.fsencode() does, so a
// name that is not UTF-8 comes back to its bytes), bytes or an os.PathLike.
inline std::string path_arg(nanobind::handle value, const char* name) {
  nanobind::object fs = nanobind::steal(PyOS_FSPath(value.ptr()));
  if (!fs.is_valid()) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": expected a path (str, bytes or os.PathLike)");
  }
  if (PyUnicode_Check(fs.ptr())) {
    fs = nanobind::steal(PyUnicode_EncodeFSDefault(fs.ptr()));
    if (!fs.is_valid()) {
      PyErr_Clear();
      throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": not a path this OS can spell");
    }
  }
  std::string out(PyBytes_AS_STRING(fs.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(fs.ptr())));
  if (out.find('\0') != std::string::npos)
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": a path with a NUL byte");
  return out;
}

// A str or bytes argument as bytes: a str is encoded as UTF-8, with lone
// surrogates (text read with errors="surrogateescape") back to their bytes.
inline std::string text_arg(nanobind::handle value, const char* name) {
  if (PyBytes_Check(value.ptr()))
    return std::string(PyBytes_AS_STRING(value.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(value.ptr())));
  if (!PyUnicode_Check(value.ptr()))
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": expected a str or bytes");
  nanobind::object b = nanobind::steal(PyUnicode_AsEncodedString(value.ptr(), "utf-8", "surrogateescape"));
  if (!b.is_valid()) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + ": a str that cannot be encoded as UTF-8");
  }
  return std::string(PyBytes_AS_STRING(b.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(b.ptr())));
}

// The items of any iterable (a list, a tuple, a generator, a dict's keys) as a
// list, or InvalidArgument naming the argument (an int, a float, None).
inline nanobind::list items_arg(nanobind::handle value, const char* name, const char* expected) {
  if (PyList_Check(value.ptr())) return nanobind::borrow<nanobind::list>(value);
  if (PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr()))
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": expected " + expected);
  PyObject* list = PySequence_List(value.ptr());
  if (!list) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": expected " + expected);
  }
  return nanobind::steal<nanobind::list>(list);
}

// A str made from bytes that may not be UTF-8 (a file name): as
// os.fsdecode() makes it (surrogateescape), so os.fsencode() gives the bytes back.
inline nanobind::str fs_str(std::string_view bytes) {
  PyObject* s = PyUnicode_DecodeFSDefaultAndSize(bytes.data(), static_cast<Py_ssize_t>(bytes.size()));
  if (!s) throw nanobind::python_error();
  return nanobind::steal<nanobind::str>(s);
}

}  // namespace ferry::python
