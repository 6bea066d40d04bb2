// os_bindings.cpp — the OS layer (src/os) for python/ferry, which makes no
// system calls of its own (issue 39): files read by name or by range, file
// identities, mappings of memory (anonymous, memfd, a passed descriptor),
// Unix packet sockets that pass descriptors, and what /proc says of
// processes. Thin: each call is one src/os function (or load/range_read.h)
// plus the message that names the file; policy stays in Python.
//
// Errors: a failed system call is OSLayerError (an OSError with .errno: callers
// test EPIPE, ENOENT ...); a file that is not a regular one, or is shorter than
// the range asked, InvalidArgumentError naming it. Calls that may wait (open,
// reads, socket waits) release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cerrno>
#include <climits>
#include <chrono>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <new>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "load/range_read.h"
#include "os/file.h"
#include "os/mapping.h"
#include "os/memory.h"
#include "os/process.h"
#include "os/smaps.h"
#include "os/unix_socket.h"
#include "python/args.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {
namespace {

void check(int err, const std::string& call) {
  if (err) throw OsError(call, err);
}

const char* kind_of(uint32_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

nb::tuple identity_tuple(const os::FileIdentity& id) {
  return nb::make_tuple(id.device, id.inode, id.size, id.mtime_ns, id.mode);
}

// ---- files ----------------------------------------------------------------

// A regular file open for reading (os::open_for_reading: a FIFO's open never
// waits, and is refused after). Closed by close(), `with`, or its collection.
struct File {
  int fd = -1;
  std::string name;

  File(const std::string& path, const std::string& display, bool direct) : name(display) {
    int opened = -1;
    int err;
    {
      GilRelease unlocked;
      err = os::open_for_reading(path.c_str(), direct, &opened);
    }
    check(err, "open of " + name);
    os::FileIdentity id;
    if (int e = os::file_identity(opened, &id)) {
      os::close_fd(opened);
      check(e, "fstat of " + name);
    }
    if (!S_ISREG(id.mode)) {  // the loader's words (load_safetensors refuses these alike)
      os::close_fd(opened);
      throw InvalidArgument(name + ": not a regular file");
    }
    fd = opened;
  }
  ~File() { close(); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  void close() noexcept {
    if (fd >= 0) os::close_fd(fd);
    fd = -1;
  }
  int live() const {
    if (fd < 0) throw InvalidArgument(name + ": this ferry File was closed");
    return fd;
  }
};

// The name of a path for messages, as os.fsdecode() spells it.
std::string display_name(nb::handle path) {
  return nb::cast<std::string>(nb::module_::import_("os").attr("fsdecode")(path));
}

// read_range's body: the bytes read, InvalidArgumentError for a short file
// unless allowed.
size_t read_into(int fd, const std::string& name, nb::handle offset_arg, nb::handle address_arg,
                 nb::handle nbytes_arg, nb::handle threads_arg, bool allow_short) {
  const uint64_t offset = int_arg<uint64_t>(offset_arg, "offset", 0, INT64_MAX);
  const uintptr_t address = int_arg<uintptr_t>(address_arg, "address");
  const size_t nbytes = size_arg(nbytes_arg, "nbytes");
  const int threads = int_arg<int>(threads_arg, "threads", 1, load::kMaxRangeReadThreads);
  if (nbytes > 0 && address == 0) throw InvalidArgument("address=0: expected the address of nbytes of memory");
  if (address > UINTPTR_MAX - nbytes) throw InvalidArgument("address + nbytes passes the end of the address space");
  // Memory that is not mapped (or not writable) needs no check here: pread
  // refuses it (EFAULT, an OSLayerError), it never faults.
  size_t got;
  {
    GilRelease unlocked;
    got = load::read_range(fd, name, offset, reinterpret_cast<void*>(address), nbytes, threads);
  }
  if (got < nbytes && !allow_short)
    throw InvalidArgument(name + ": ends at byte " + std::to_string(offset + got) + ", before byte " +
                          std::to_string(offset + nbytes) + " (the end of the range read): the file is shorter " +
                          "than expected, or shrank while it was read");
  return got;
}

// read_range for a ferry File, a descriptor of a regular file, or a path.
size_t read_range_of(nb::handle file, nb::handle offset, nb::handle address, nb::handle nbytes, nb::handle threads,
                     nb::handle allow_short) {
  const bool short_ok = bool_arg(allow_short, "allow_short");
  if (nb::isinstance<File>(file)) {
    const File& f = nb::cast<const File&>(file);
    return read_into(f.live(), f.name, offset, address, nbytes, threads, short_ok);
  }
  if (PyLong_Check(file.ptr()) && !PyBool_Check(file.ptr())) {
    const int fd = int_arg<int>(file, "file", 0, INT_MAX);
    const std::string name = "descriptor " + std::to_string(fd);
    os::FileIdentity id;
    check(os::file_identity(fd, &id), "fstat of " + name);
    if (!S_ISREG(id.mode)) throw InvalidArgument(name + ": " + kind_of(id.mode) + ", not a regular file");
    return read_into(fd, name, offset, address, nbytes, threads, short_ok);
  }
  File f(path_arg(file, "file"), display_name(file), false);
  return read_into(f.fd, f.name, offset, address, nbytes, threads, short_ok);
}

nb::tuple path_identity(nb::handle path) {
  const std::string p = path_arg(path, "path");
  os::FileIdentity id;
  int err;
  {
    GilRelease unlocked;
    err = os::path_identity(p.c_str(), &id);
  }
  check(err, "stat of " + display_name(path));
  return identity_tuple(id);
}

// read_regular_file's body: (bytes, '', False) or (None, why, missing).
nb::tuple read_regular_file(nb::handle path, nb::handle limit_arg) {
  const std::string p = path_arg(path, "path");
  const size_t limit = size_arg(limit_arg, "limit");
  int fd = -1;
  int err;
  {
    GilRelease unlocked;
    err = os::open_for_reading(p.c_str(), false, &fd);
  }
  if (err)
    return nb::make_tuple(nb::none(), std::string("cannot open it: ") + std::strerror(err),
                          err == ENOENT || err == ENOTDIR);
  struct Closer {
    int fd;
    ~Closer() { os::close_fd(fd); }
  } closer{fd};
  os::FileIdentity id;
  if ((err = os::file_identity(fd, &id)))
    return nb::make_tuple(nb::none(), std::string("cannot read it: ") + std::strerror(err), false);
  if (!S_ISREG(id.mode)) {
    const std::string kind = kind_of(id.mode);
    return nb::make_tuple(nb::none(), kind == "not a regular file" ? kind : kind + ", not a regular file", false);
  }
  if (id.size > limit)
    return nb::make_tuple(nb::none(), std::to_string(id.size) + " bytes, more than " + std::to_string(limit), false);
  if (limit == SIZE_MAX) throw InvalidArgument("limit: expected a byte count below the largest one");
  // The size fstat saw and one byte more (a file that grew shows), then
  // 1 MiB at a time up to limit + 1.
  std::string data;
  size_t have = 0, got = 0;
  size_t step = static_cast<size_t>(std::min<uint64_t>(id.size, limit) + 1);
  {
    GilRelease unlocked;
    for (;;) {
      try {
        data.resize(have + step);
      } catch (const std::bad_alloc&) {
        err = ENOMEM;
        break;
      }
      if ((err = os::read_at(fd, data.data() + have, step, have, &got))) break;
      have += got;
      if (got < step || have > limit) break;
      step = std::min<size_t>(size_t{1} << 20, limit + 1 - have);
    }
  }
  got = have;
  if (err) return nb::make_tuple(nb::none(), std::string("cannot read it: ") + std::strerror(err), false);
  if (got > limit) return nb::make_tuple(nb::none(), "more than " + std::to_string(limit) + " bytes", false);
  return nb::make_tuple(nb::bytes(data.data(), got), "", false);
}

void write_stream(nb::handle path, nb::bytes data) {
  const std::string p = path_arg(path, "path");
  const std::string name = display_name(path);
  int fd = -1;
  int err;
  {
    GilRelease unlocked;
    err = os::open_stream_for_writing(p.c_str(), &fd);
  }
  if (err == ENXIO) throw OsError(name + " is a FIFO with no reader: open", err);
  if (err == EINVAL) throw OsError(name + " is not a character device or a FIFO: open", err);
  check(err, "open of " + name);
  size_t done = 0;
  {
    GilRelease unlocked;
    err = os::write_all(fd, data.c_str(), data.size(), &done);
    os::close_fd(fd);
  }
  check(err, "write to " + name + " after " + std::to_string(done) + " bytes");
}

void bind_file_class(nb::module_& m) {
  nb::class_<File>(m, "File",
                   "A regular file open for reading (FIFOs, devices and directories refused at once, "
                   "without waiting).")
      .def("__init__",
           [](File* f, nb::handle path, nb::handle direct) {
             new (f) File(path_arg(path, "path"), display_name(path), bool_arg(direct, "direct"));
           },
           "path"_a, "direct"_a.none() = false,
           "direct=True: O_DIRECT (reads then need address, offset and nbytes aligned to DIRECT_IO_ALIGNMENT; "
           "OSLayerError EINVAL where the file system has no O_DIRECT, e.g. tmpfs).")
      .def_prop_ro("fd", [](const File& f) { return f.live(); })
      .def_prop_ro("name", [](const File& f) { return f.name; })
      .def_prop_ro("closed", [](const File& f) { return f.fd < 0; })
      .def("identity",
           [](const File& f) {
             os::FileIdentity id;
             check(os::file_identity(f.live(), &id), "fstat of " + f.name);
             return identity_tuple(id);
           },
           "(device, inode, size, mtime_ns, mode) of the open file now (fstat).")
      .def("read_range",
           [](const File& f, nb::handle offset, nb::handle address, nb::handle nbytes, nb::handle threads,
              nb::handle allow_short) {
             return read_into(f.live(), f.name, offset, address, nbytes, threads, bool_arg(allow_short, "allow_short"));
           },
           "offset"_a.none(), "address"_a.none(), "nbytes"_a.none(), "threads"_a.none() = 1,
           "allow_short"_a.none() = false,
           "Reads file bytes [offset, offset + nbytes) to memory at `address` with `threads` threads (the GIL "
           "released); returns the bytes read. Where the file ends first: InvalidArgumentError naming the byte, "
           "or with allow_short=True the bytes before the end.")
      .def("close", &File::close)
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](File& f, nb::args) { f.close(); });
}

// Reads by range, file identities, whole small files, writes to a stream.
void bind_files(nb::module_& m) {
  bind_file_class(m);
  m.def("read_range", &read_range_of, "file"_a, "offset"_a.none(), "address"_a.none(), "nbytes"_a.none(),
        "threads"_a.none() = 1, "allow_short"_a.none() = false,
        "File.read_range for `file`: a ferry File, a descriptor of a regular file, or a path (opened, read, "
        "closed).");

  m.def("path_identity", &path_identity, "path"_a,
        "(device, inode, size, mtime_ns, mode) of the file at `path` (stat: links followed).");

  m.def("read_regular_file", &read_regular_file, "path"_a, "limit"_a,
        "(bytes, '', False) of the regular file at `path` when it holds at most `limit` bytes; else "
        "(None, why, missing): why a short phrase, missing True when nothing is there (ENOENT, ENOTDIR).");

  m.def("write_stream", &write_stream, "path"_a, "data"_a,
        "Writes data into the character device or FIFO at path (never replacing it): a FIFO without a reader "
        "is OSLayerError ENXIO at once, not a wait; anything else is EINVAL.");

  m.def("close_descriptor", [](int fd) { check(os::close_fd(fd), "close of descriptor " + std::to_string(fd)); },
        "fd"_a, "Closes a descriptor a ferry call handed over (a received one that is not kept).");
}

// ---- memory -----------------------------------------------------------------

// A mapping of this process's: anonymous, a new memfd's or a passed
// descriptor's, unmapped when closed or collected. Its bytes are a writable
// buffer (memoryview, torch.frombuffer); close() refuses while views of it
// live (BufferError), so no view points at unmapped memory.
struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  long exports = 0;  // live buffer-protocol views (GIL-guarded)

  ~Mapping() {
    if (base) os::unmap(base, bytes);
  }
  void close() {
    if (!base) return;
    if (exports > 0)
      throw nb::buffer_error(("cannot close a ferry Mapping while " + std::to_string(exports) +
                              " view(s) of it are alive")
                                 .c_str());
    os::unmap(base, bytes);
    base = nullptr;
  }
  void* live() const {
    if (!base) throw InvalidArgument("this ferry Mapping was closed");
    return base;
  }
};

int mapping_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  Mapping* m = nb::inst_ptr<Mapping>(self);
  if (!m->base) {
    PyErr_SetString(PyExc_BufferError, "this ferry Mapping was closed");
    view->obj = nullptr;
    return -1;
  }
  if (PyBuffer_FillInfo(view, self, m->base, static_cast<Py_ssize_t>(m->bytes), 0, flags) < 0) return -1;
  ++m->exports;
  return 0;
}

void mapping_releasebuffer(PyObject* self, Py_buffer*) { --nb::inst_ptr<Mapping>(self)->exports; }

PyType_Slot mapping_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(mapping_getbuffer)},
                               {Py_bf_releasebuffer, reinterpret_cast<void*>(mapping_releasebuffer)},
                               {0, nullptr}};

// huge: True MADV_HUGEPAGE, False MADV_NOHUGEPAGE, None no advice.
void advise(void* p, size_t bytes, nb::handle huge) {
  if (huge.is_none()) return;
  if (bool_arg(huge, "huge"))
    check(os::advise_huge(p, bytes), "madvise(MADV_HUGEPAGE)");
  else
    check(os::advise_no_huge(p, bytes), "madvise(MADV_NOHUGEPAGE)");
}

size_t mapping_bytes(nb::handle nbytes) {
  const size_t n = size_arg(nbytes, "nbytes");
  if (n == 0 || n > (size_t{1} << 50)) throw InvalidArgument("nbytes=" + std::to_string(n) + ": expected 1 .. 2^50");
  return (n + os::kHugePage2MBytes - 1) / os::kHugePage2MBytes * os::kHugePage2MBytes;
}

void bind_memory(nb::module_& m) {
  nb::class_<Mapping>(m, "Mapping", nb::type_slots(mapping_slots),
                      "Memory mapped into this process (anonymous, a memfd, a passed descriptor); a writable buffer.")
      .def_static(
          "anonymous",
          [](nb::handle nbytes, nb::handle huge) {
            const size_t n = mapping_bytes(nbytes);
            auto* out = new Mapping();
            nb::object o = nb::cast(out, nb::rv_policy::take_ownership);
            check(os::map_anonymous(n, os::kHugePage2MBytes, &out->base), "mmap of " + std::to_string(n) + " bytes");
            out->bytes = n;
            advise(out->base, n, huge);
            return o;
          },
          "nbytes"_a.none(), "huge"_a.none() = nb::none(),
          "Private anonymous memory, nbytes rounded up to 2 MiB, 2 MiB aligned; huge: True MADV_HUGEPAGE, False "
          "MADV_NOHUGEPAGE, None no advice.")
      .def_static(
          "memfd",
          [](nb::handle nbytes, nb::handle huge, const std::string& name) {
            const size_t n = mapping_bytes(nbytes);
            int fd = -1;
            check(os::create_memfd(name.c_str(), n, 0, &fd), "memfd_create of " + std::to_string(n) + " bytes");
            auto* out = new Mapping();
            nb::object o = nb::cast(out, nb::rv_policy::take_ownership);
            const int err = os::map_shared(fd, n, os::kHugePage2MBytes, &out->base);
            os::close_fd(fd);  // the mapping keeps the file
            check(err, "mmap of a memfd of " + std::to_string(n) + " bytes");
            out->bytes = n;
            advise(out->base, n, huge);
            return o;
          },
          "nbytes"_a.none(), "huge"_a.none() = nb::none(), "name"_a = "ferry-mapping",
          "Shared memory of a new memfd (shmem), nbytes rounded up to 2 MiB, 2 MiB aligned; the descriptor is "
          "closed (the mapping keeps the file). huge as for anonymous().")
      .def_static(
          "shared",
          [](int fd) {
            os::FileIdentity id;
            check(os::file_identity(fd, &id), "fstat of descriptor " + std::to_string(fd));
            if (!S_ISREG(id.mode) || id.size == 0)
              throw InvalidArgument("descriptor " + std::to_string(fd) + ": " +
                                    (S_ISREG(id.mode) ? std::string("an empty file") : kind_of(id.mode)) +
                                    ", not memory to map");
            auto* out = new Mapping();
            nb::object o = nb::cast(out, nb::rv_policy::take_ownership);
            check(os::map_shared(fd, id.size, os::kSmallPageBytes, &out->base),
                  "mmap of descriptor " + std::to_string(fd));
            out->bytes = id.size;
            return o;
          },
          "fd"_a,
          "The whole of the file behind descriptor fd (a memfd another process passed), MAP_SHARED read-write; "
          "the caller still closes fd.")
      .def_prop_ro("address", [](const Mapping& mp) { return reinterpret_cast<uintptr_t>(mp.live()); })
      .def_prop_ro("nbytes", [](const Mapping& mp) { return mp.bytes; })
      .def_prop_ro("closed", [](const Mapping& mp) { return mp.base == nullptr; })
      .def_prop_ro("exports", [](const Mapping& mp) { return mp.exports; })
      .def("huge_bytes",
           [](const Mapping& mp) {
             const uintptr_t lo = reinterpret_cast<uintptr_t>(mp.live());
             std::string text;
             check(os::read_smaps(&text), "read of /proc/self/smaps");
             const os::SmapsTotals t = os::parse_smaps(text, lo, lo + mp.bytes);
             return t.anon_huge_bytes + t.pmd_mapped_bytes + t.hugetlb_bytes;
           },
           "Bytes of the mappings over this one backed by huge pages (/proc/self/smaps: AnonHugePages, "
           "Shmem/FilePmdMapped, hugetlb).")
      .def("close", &Mapping::close, "Unmaps now (BufferError while views of it are alive).")
      .def("__len__", [](const Mapping& mp) { return mp.bytes; });
}

// A view of memory something else owns (a node pool's block, a pinned pool's
// allocation), for memoryview and torch.frombuffer without ctypes: it holds
// `owner` (whose life keeps the memory mapped) and refuses a range that is
// not mapped (os::range_is_mapped) instead of faulting later.
struct MemorySpan {
  uintptr_t address = 0;
  size_t bytes = 0;
  bool readonly = false;
  nb::object owner;
};

int span_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  MemorySpan* s = nb::inst_ptr<MemorySpan>(self);
  return PyBuffer_FillInfo(view, self, reinterpret_cast<void*>(s->address), static_cast<Py_ssize_t>(s->bytes),
                           s->readonly ? 1 : 0, flags);
}

PyType_Slot span_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(span_getbuffer)}, {0, nullptr}};

void bind_span(nb::module_& m) {
  nb::class_<MemorySpan>(m, "MemorySpan", nb::type_slots(span_slots),
                         "A buffer over nbytes at address, kept valid by `owner` (held while the span lives).")
      .def("__init__",
           [](MemorySpan* s, nb::handle address_arg, nb::handle nbytes_arg, nb::handle owner, nb::handle ro) {
             const uintptr_t address = int_arg<uintptr_t>(address_arg, "address");
             const size_t nbytes = size_arg(nbytes_arg, "nbytes");
             const bool readonly = bool_arg(ro, "readonly");
             if (nbytes > PY_SSIZE_T_MAX || address > UINTPTR_MAX - nbytes)
               throw InvalidArgument("nbytes=" + std::to_string(nbytes) + ": passes the end of the address space");
             if (nbytes > 0 && (address == 0 || os::range_is_mapped(reinterpret_cast<void*>(address), nbytes) != 0))
               throw InvalidArgument("address=" + format_address(address) + ", nbytes=" + std::to_string(nbytes) +
                                     ": not all of it is mapped in this process");
             new (s) MemorySpan{address, nbytes, readonly, nb::borrow(owner)};
           },
           "address"_a.none(), "nbytes"_a.none(), "owner"_a.none(), "readonly"_a.none() = false)
      .def_prop_ro("address", [](const MemorySpan& s) { return s.address; })
      .def_prop_ro("owner", [](const MemorySpan& s) { return s.owner; })
      .def("__len__", [](const MemorySpan& s) { return s.bytes; });
}

// ---- sockets ------------------------------------------------------------------

// One end of a Unix SOCK_SEQPACKET socket (os::packet_socket_pair) whose
// messages may carry a descriptor. Every wait is bounded by its timeout.
struct PacketSocket {
  int fd = -1;
  explicit PacketSocket(int f) : fd(f) {}
  ~PacketSocket() { close(); }
  PacketSocket(const PacketSocket&) = delete;
  PacketSocket& operator=(const PacketSocket&) = delete;
  void close() noexcept {
    if (fd >= 0) os::close_fd(fd);
    fd = -1;
  }
  int live() const {
    if (fd < 0) throw InvalidArgument("this ferry PacketSocket was closed");
    return fd;
  }
};

// Nanoseconds of a timeout in seconds: None or inf no limit (-1), else >= 0.
int64_t timeout_ns(nb::handle timeout) {
  if (timeout.is_none()) return -1;
  const double s = real_arg(timeout, "timeout_s", 0.0, INFINITY);
  return std::isinf(s) || s > 9e9 ? -1 : static_cast<int64_t>(s * 1e9);
}

int64_t left_ns(int64_t limit, const std::chrono::steady_clock::time_point& start) {
  if (limit < 0) return -1;
  const int64_t spent =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  return std::max<int64_t>(0, limit - spent);
}

void bind_sockets(nb::module_& m) {
  nb::class_<PacketSocket>(m, "PacketSocket",
                           "One end of a Unix SOCK_SEQPACKET socket whose messages may carry a descriptor.")
      .def(nb::init<int>(), "fd"_a, "Adopts descriptor fd (one end of packet_socket_pair, passed to a child).")
      .def("fileno", [](const PacketSocket& s) { return s.live(); })
      .def_prop_ro("closed", [](const PacketSocket& s) { return s.fd < 0; })
      .def("send",
           [](PacketSocket& s, nb::bytes data, int passed, nb::handle timeout) -> bool {
             const int fd = s.live();
             const int64_t limit = timeout_ns(timeout);
             const std::string message(data.c_str(), data.size());
             const auto start = std::chrono::steady_clock::now();
             GilRelease unlocked;
             for (;;) {
               const int err = passed >= 0 ? os::send_with_fd(fd, message.data(), message.size(), passed)
                                           : os::send_message(fd, message.data(), message.size());
               if (err == EPIPE || err == ECONNRESET) return false;  // no exception: callers at exit see this
               if (err != EAGAIN) {
                 check(err, "send on a packet socket");
                 return true;
               }
               const int waited = os::wait_writable(fd, left_ns(limit, start));
               if (waited == ETIMEDOUT) throw OsError("send on a packet socket (its peer's queue stayed full)", ETIMEDOUT);
               check(waited, "poll of a packet socket");
             }
           },
           "data"_a, "fd"_a = -1, "timeout_s"_a.none() = nb::none(),
           "Sends one message, with descriptor fd attached when fd >= 0, waiting at most timeout_s seconds "
           "while the peer's queue is full (None: no limit). True: sent; False: the peer closed its end (EPIPE, "
           "ECONNRESET; no exception, so a loader's shutdown at interpreter exit needs no import). OSLayerError "
           "ETIMEDOUT after the timeout, or another errno.")
      .def("receive",
           [](PacketSocket& s, size_t max_bytes, nb::handle timeout) -> nb::object {
             const int fd = s.live();
             if (max_bytes == 0 || max_bytes > (size_t{1} << 20))
               throw InvalidArgument("max_bytes=" + std::to_string(max_bytes) + ": expected 1 .. 1048576");
             const int64_t limit = timeout_ns(timeout);
             std::string buf(max_bytes, '\0');
             size_t got = 0;
             int passed = -1;
             bool truncated = false;
             {
               const auto start = std::chrono::steady_clock::now();
               GilRelease unlocked;
               for (;;) {
                 const int err = os::receive_message(fd, buf.data(), buf.size(), &got, &passed, &truncated);
                 if (err == 0) break;
                 if (err != EAGAIN) throw OsError("receive on a packet socket", err);
                 const int64_t left = left_ns(limit, start);
                 if (left == 0) return nb::none();
                 size_t ready;
                 const int waited = os::wait_readable(&fd, 1, left, &ready);
                 if (waited == ETIMEDOUT) return nb::none();
                 if (waited != EINTR) check(waited, "poll of a packet socket");
               }
             }
             return nb::make_tuple(nb::bytes(buf.data(), got), passed, truncated);
           },
           "max_bytes"_a, "timeout_s"_a.none() = 0.0,
           "One message: (data, fd or -1, truncated), or None when none came within timeout_s seconds (0: do not "
           "wait; None: no limit). (b'', -1, False): the peer closed its end. A received fd is the caller's to "
           "close (close_descriptor). truncated: longer than max_bytes, or more descriptors than one.")
      .def("close", &PacketSocket::close)
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](PacketSocket& s, nb::args) { s.close(); });

  m.def("packet_socket_pair",
        [] {
          int a = -1, b = -1;
          check(os::packet_socket_pair(&a, &b), "socketpair(AF_UNIX, SOCK_SEQPACKET)");
          return nb::make_tuple(nb::cast(new PacketSocket(a), nb::rv_policy::take_ownership),
                                nb::cast(new PacketSocket(b), nb::rv_policy::take_ownership));
        },
        "Two connected PacketSockets (close-on-exec).");
}

// ---- processes --------------------------------------------------------------------

void bind_processes(nb::module_& m) {
  m.def("process_start_ticks",
        [](int pid) -> nb::object {
          if (pid < 0) throw InvalidArgument("pid=" + std::to_string(pid) + ": expected 0 (this process) or a pid");
          uint64_t ticks = 0;
          const int err = os::process_start_ticks(static_cast<pid_t>(pid), &ticks);
          if (err == ESRCH) return nb::none();
          check(err, "read of /proc/" + (pid == 0 ? std::string("self") : std::to_string(pid)) + "/stat");
          return nb::int_(ticks);
        },
        "pid"_a,
        "The start time of process pid (field 22 of /proc/PID/stat, clock ticks after boot; 0: this process), "
        "None when there is no such process; OSLayerError otherwise (EPROTO: a stat line of another shape).");
  m.def("boot_id",
        [] {
          std::string id;
          check(os::read_boot_id(&id), "read of /proc/sys/kernel/random/boot_id");
          return nb::bytes(id.data(), id.size());
        },
        "This boot's id (bytes), OSLayerError where /proc cannot tell.");
  m.def("pid_namespace",
        [] {
          std::string ns;
          check(os::read_pid_namespace(&ns), "readlink of /proc/self/ns/pid");
          return nb::bytes(ns.data(), ns.size());
        },
        "The link /proc/self/ns/pid (bytes): this process's PID namespace; OSLayerError EXDEV where /proc is of "
        "another PID namespace.");
}

}  // namespace

void bind_os(nb::module_& m) {
  // O_DIRECT's alignment, one fact for the C++ loader and Python's writers.
  m.attr("DIRECT_IO_ALIGNMENT") = os::kDirectIoAlignment;
  bind_files(m);
  bind_memory(m);
  bind_span(m);
  bind_sockets(m);
  bind_processes(m);
}

}  // namespace ferry::python
