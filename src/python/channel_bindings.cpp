// channel_bindings.cpp — ferry._ferry.Channel (thin bindings of
// ferry::cuda::Channel), gdrcopy_status(), and the channel's timing loop for
// `ferry bench` (in C++: a Python loop would measure Python). Device addresses
// are plain ints here; python/ferry/channel.py resolves tensors into them.
//
// Every request releases the GIL: several Python threads may share a channel.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/channel/channel.h"
#include "cuda/channel/gdrcopy.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {
namespace {

void* address(uintptr_t p) { return reinterpret_cast<void*>(p); }

// A contiguous buffer-protocol view, held for the duration of a request.
class HeldBuffer {
 public:
  HeldBuffer(nb::handle obj, bool writable) {
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw nb::python_error();
  }
  ~HeldBuffer() { PyBuffer_Release(&view_); }
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;
  void* data() const { return view_.buf; }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

nb::bytes read_bytes(cuda::Channel& c, uintptr_t dev_src, size_t n) {
  if (n == 0 || n > cuda::kChannelMaxPayload) c.read(nullptr, address(dev_src), n);  // throws the size error
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
  if (!out) throw nb::python_error();
  nb::bytes result = nb::steal<nb::bytes>(out);
  {
    ferry::python::GilRelease unlocked;  // `out` is not shared with anyone yet
    c.read(PyBytes_AsString(out), address(dev_src), n);
  }
  return result;
}

// Nanoseconds of each of `iterations` requests ("write", "read", "fill" of
// nbytes at dev_ptr, or "ping"), after no warm-up: call it once more for that.
std::vector<uint64_t> time_requests_ns(cuda::Channel& c, const std::string& op, uintptr_t dev_ptr,
                                       size_t nbytes, int iterations) {
  if (op != "write" && op != "read" && op != "fill" && op != "ping")
    throw InvalidArgument("op '" + op + "': expected write, read, fill or ping");
  if (iterations < 1)
    throw InvalidArgument("iterations=" + std::to_string(iterations) + ": expected at least 1");
  std::vector<unsigned char> host(nbytes ? nbytes : 1);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 131u + 7u);
  std::vector<uint64_t> ns;
  ns.reserve(static_cast<size_t>(iterations));
  ferry::python::GilRelease unlocked;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (op == "write") c.write(address(dev_ptr), host.data(), nbytes);
    else if (op == "read") c.read(host.data(), address(dev_ptr), nbytes);
    else if (op == "fill") c.fill(address(dev_ptr), i & 0xff, nbytes);
    else c.ping();
    const auto t1 = std::chrono::steady_clock::now();
    ns.push_back(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
  }
  return ns;
}

nb::dict stats_dict(const cuda::ChannelStats& s) {
  nb::dict d;
  d["requests"] = s.requests;
  d["launches"] = s.launches;
  d["idle_exits"] = s.idle_exits;
  d["gdrcopy_writes"] = s.gdrcopy_writes;
  return d;
}

}  // namespace

void bind_channel(nb::module_& m) {
  m.attr("CHANNEL_MAX_PAYLOAD") = cuda::kChannelMaxPayload;
  m.def("gdrcopy_status", [] {
    const cuda::GdrcopyStatus& s = cuda::gdrcopy_status();
    return nb::make_tuple(s.available, s.reason);
  });

  nb::class_<cuda::Channel>(m, "Channel")
      .def("__init__",
           [](cuda::Channel* c, int device, uint32_t idle_us, uint32_t slots, uint32_t timeout_ms,
              uint32_t spin_us, bool use_gdrcopy) {
             cuda::ChannelOptions o;
             o.idle_us = idle_us;
             o.slots = slots;
             o.timeout_ms = timeout_ms;
             o.spin_us = spin_us;
             o.use_gdrcopy = use_gdrcopy;
             ferry::python::GilRelease unlocked;
             new (c) cuda::Channel(device, o);
           },
           "device"_a, "idle_us"_a, "slots"_a, "timeout_ms"_a, "spin_us"_a, "use_gdrcopy"_a)
      .def("write",
           [](cuda::Channel& c, uintptr_t dev_dst, nb::handle data) {
             HeldBuffer b(data, false);
             ferry::python::GilRelease unlocked;
             c.write(address(dev_dst), b.data(), b.size());
           },
           "dev_dst"_a, "data"_a)
      .def("read", &read_bytes, "dev_src"_a, "nbytes"_a)
      .def("read_into",
           [](cuda::Channel& c, uintptr_t dev_src, nb::handle out) {
             HeldBuffer b(out, true);
             ferry::python::GilRelease unlocked;
             c.read(b.data(), address(dev_src), b.size());
           },
           "dev_src"_a, "out"_a)
      .def("fill",
           [](cuda::Channel& c, uintptr_t dev_dst, int value, size_t n) {
             ferry::python::GilRelease unlocked;
             c.fill(address(dev_dst), value, n);
           },
           "dev_dst"_a, "value"_a, "nbytes"_a)
      .def("signal",
           [](cuda::Channel& c, uintptr_t dev_flag, uint32_t value) {
             ferry::python::GilRelease unlocked;
             c.signal(static_cast<uint32_t*>(address(dev_flag)), value);
           },
           "dev_flag"_a, "value"_a)
      .def("wait",
           [](cuda::Channel& c, uintptr_t dev_flag, uint32_t value, uint64_t timeout_us) {
             ferry::python::GilRelease unlocked;
             return c.wait(static_cast<const uint32_t*>(address(dev_flag)), value, timeout_us);
           },
           "dev_flag"_a, "value"_a, "timeout_us"_a)
      .def("ping",
           [](cuda::Channel& c) {
             ferry::python::GilRelease unlocked;
             return c.ping();
           })
      .def("stats", [](const cuda::Channel& c) { return stats_dict(c.stats()); })
      .def("close",
           [](cuda::Channel& c) {
             ferry::python::GilRelease unlocked;
             c.close();
           })
      .def("time_ns", &time_requests_ns, "op"_a, "dev_ptr"_a, "nbytes"_a, "iterations"_a)
      .def_prop_ro("closed", &cuda::Channel::closed)
      .def_prop_ro("device", &cuda::Channel::device)
      .def_prop_ro("idle_us", [](const cuda::Channel& c) { return c.options().idle_us; })
      .def_prop_ro("slots", [](const cuda::Channel& c) { return c.options().slots; })
      .def_prop_ro("timeout_ms", [](const cuda::Channel& c) { return c.options().timeout_ms; })
      .def_prop_ro("use_gdrcopy", [](const cuda::Channel& c) { return c.options().use_gdrcopy; });
}

}  // namespace ferry::python
