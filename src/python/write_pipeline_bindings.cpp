// write_pipeline_bindings.cpp — save's files for python/ferry: AtomicFile
// (load/atomic_file.h; its save() is load/save_file.h with the CUDA side of
// cuda/load/file_writer.h), PathLock (load/path_lock.h) and sync_directory.
// Python describes (names, layouts, plans, errors); these make the calls.
//
// Safe at interpreter exit by construction: every argument is copied into
// C++ (the header, the parts' addresses, paths) or held by a shared_ptr (the
// file, the ring's pool) before the GIL is released, and no Python object is
// touched until the call returns. A call that finds the exit hook already
// ran (gil.h: the GIL could not be released) is refused. The GIL is released
// for every system call and for the whole of a save.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/load/file_writer.h"
#include "load/atomic_file.h"
#include "load/path_lock.h"
#include "load/save_file.h"
#include "os/file_replace.h"
#include "python/args.h"
#include "python/copy_args.h"
#include "python/gil.h"
#include "python/handles.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {
namespace {

// The GIL released for a scope, or NotSupported once the interpreter exits.
struct Unlocked {
  explicit Unlocked(const char* what) {
    if (!g.released())
      throw NotSupported(std::string(what) + ": the interpreter is exiting; a save does not start now");
  }
  GilRelease g;
};

struct FileHandle {
  std::shared_ptr<load::AtomicFile> file;
};

std::vector<std::string> paths_arg(nb::handle h, const char* name) {
  std::vector<std::string> out;
  for (nb::handle p : items_arg(h, name, "a list of paths")) out.push_back(path_arg(p, name));
  return out;
}

std::string bytes_of(nb::handle data, const char* name) {
  Py_buffer view;
  if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + ": expected a bytes-like object, not " + Py_TYPE(data.ptr())->tp_name);
  }
  std::string out(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return out;
}

load::FileLayout layout_arg(nb::handle header, nb::handle parts) {
  load::FileLayout layout;
  layout.header = bytes_of(header, "header");
  for (nb::handle p : items_arg(parts, "parts", "a list of (address, nbytes, device) tuples")) {
    nb::tuple t = nb::cast<nb::tuple>(p);
    if (t.size() != 3) throw InvalidArgument("parts[i]: expected (address, nbytes, device)");
    layout.parts.push_back(load::FilePart{int_arg<uintptr_t>(t[0], "parts[i] address"),
                                          int_arg<uint64_t>(t[1], "parts[i] nbytes"),
                                          int_arg<int>(t[2], "parts[i] device", -1, 1023)});
  }
  return layout;
}

std::vector<cuda::SaveDevice> devices_arg(nb::handle devices) {
  std::vector<cuda::SaveDevice> out;
  for (nb::handle d : items_arg(devices, "devices", "a list of (device, engine, stream) tuples")) {
    nb::tuple t = nb::cast<nb::tuple>(d);
    if (t.size() != 3) throw InvalidArgument("devices[i]: expected (device, engine, stream)");
    const int device = int_arg<int>(t[0], "devices[i] device", 0, 1023);
    // The stream as copy_many takes it (copy_args.h): None, torch's current stream on that device.
    out.push_back(cuda::SaveDevice{device, &nb::cast<cuda::CopyEngine&>(t[1]), stream_of(t[2], device)});
  }
  return out;
}

nb::dict save(FileHandle& h, nb::handle header, nb::handle parts, nb::handle pool, nb::handle devices,
              nb::handle slot_bytes, nb::handle slots, nb::handle writers, nb::handle like, nb::handle reserve) {
  const load::FileLayout layout = layout_arg(header, parts);
  std::shared_ptr<Pool> ring_pool = nb::cast<PoolHandle&>(pool).pool;
  if (!ring_pool) throw InvalidArgument("save: the ring's pool is closed");
  const std::vector<cuda::SaveDevice> devs = devices_arg(devices);
  load::SaveOptions o;
  o.slot_bytes = size_arg(slot_bytes, "slot_bytes");
  o.slots = size_arg(slots, "slots");
  o.writers = int_arg<int>(writers, "writers", 1, 64);
  o.reserve = bool_arg(reserve, "reserve");
  const std::vector<std::string> like_paths = paths_arg(like, "like");
  std::shared_ptr<load::AtomicFile> file = h.file;  // held by this call until it returns
  load::SaveStats st;
  {
    Unlocked unlocked("save");
    std::optional<cuda::EngineReads> reads;
    if (!devs.empty()) reads.emplace(devs, o.slots);
    st = load::save_file(*file, layout, *ring_pool, reads ? &*reads : nullptr, o, like_paths);
  }
  nb::dict d;
  d["bytes"] = st.bytes;
  d["writes"] = st.writes;
  d["copied_bytes"] = st.copied_bytes;
  d["direct"] = st.direct;
  d["seconds"] = st.seconds;
  nb::list notes;
  for (const std::string& n : st.notes) notes.append(n);
  d["notes"] = notes;
  return d;
}

struct LockHandle {
  std::shared_ptr<load::PathLock> lock;
};

// Tries in slices of 0.1 s with the GIL released, Ctrl-C seen between them.
void acquire(LockHandle& h, nb::handle timeout) {
  const double limit = real_arg(timeout, "timeout", 0, 1e9);
  std::shared_ptr<load::PathLock> lock = h.lock;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bool held;
    {
      Unlocked unlocked("the publish lock");
      held = lock->try_for(std::min(0.1, std::max(0.0, limit - waited)));
    }
    if (held) return;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= limit)
      throw lock->timeout_error(limit);
  }
}

// AtomicFile: a file written whole or not at all, and save() into it.
void bind_atomic_file(nb::module_& m) {
  nb::class_<FileHandle>(m, "AtomicFile",
                         "A file written whole or not at all (load/atomic_file.h): a temporary file that finish() "
                         "cuts, gives the replaced file's mode and owner and fsyncs, and publish() renames over path.")
      .def(
          "__init__",
          [](FileHandle* self, nb::handle path, nb::handle temp_path, nb::handle direct, nb::handle durable) {
            std::string p = path_arg(path, "path"), t = path_arg(temp_path, "temp_path");
            const bool d = bool_arg(direct, "direct"), dur = bool_arg(durable, "durable");
            std::shared_ptr<load::AtomicFile> f;
            {
              Unlocked unlocked("AtomicFile");
              f = std::make_shared<load::AtomicFile>(std::move(p), std::move(t), d, dur);
            }
            new (self) FileHandle{std::move(f)};
          },
          "path"_a, "temp_path"_a, "direct"_a, "durable"_a)
      .def(
          "write",
          [](FileHandle& h, nb::handle data, nb::handle offset) {
            const std::string bytes = bytes_of(data, "data");
            const uint64_t at = int_arg<uint64_t>(offset, "offset");
            std::shared_ptr<load::AtomicFile> f = h.file;
            Unlocked unlocked("AtomicFile.write");
            f->write(bytes.data(), bytes.size(), at);
          },
          "data"_a, "offset"_a, "Writes all of data at offset (a direct write refused: buffered from then on).")
      .def(
          "finish",
          [](FileHandle& h, nb::handle length, nb::handle like) {
            const uint64_t n = int_arg<uint64_t>(length, "length");
            const std::vector<std::string> paths = paths_arg(like, "like");
            std::shared_ptr<load::AtomicFile> f = h.file;
            Unlocked unlocked("AtomicFile.finish");
            f->finish(n, paths);
          },
          "length"_a, "like"_a)
      .def(
          "publish",
          [](FileHandle& h, bool fsync_dir) {
            std::shared_ptr<load::AtomicFile> f = h.file;
            Unlocked unlocked("AtomicFile.publish");
            f->publish(fsync_dir);
          },
          "fsync_dir"_a = true)
      .def("abort", [](FileHandle& h) { h.file->abort(); }, "Closes and removes the temporary file (never raises).")
      .def("save", &save, "header"_a, "parts"_a, "pool"_a, "devices"_a, "slot_bytes"_a, "slots"_a, "writers"_a,
           "like"_a, "reserve"_a = true,
           "Writes the file whole from its layout (load/save_file.h): header bytes, then parts [(address, nbytes, "
           "device or -1)] in file order, through slots of `pool` (pinned where a part is on a GPU); devices: "
           "[(device, engine, stream: None for torch's current one, a handle or a torch.cuda.Stream)], each read "
           "on a stream ordered after that stream. Then finish() "
           "(mode and owner of the first regular file of like). Returns {'bytes', 'writes', 'copied_bytes', "
           "'direct', 'seconds', 'notes'}.")
      .def_prop_rw(
          "path", [](FileHandle& h) { return fs_str(h.file->path()); },
          [](FileHandle& h, nb::handle p) { h.file->set_path(path_arg(p, "path")); })
      .def_prop_ro("temp_path", [](FileHandle& h) { return fs_str(h.file->temp_path()); })
      .def_prop_ro("direct", [](FileHandle& h) { return h.file->direct(); })
      .def_prop_ro("durable", [](FileHandle& h) { return h.file->durable(); })
      .def_prop_ro("fd", [](FileHandle& h) { return h.file->fd(); })
      .def_prop_ro("notes", [](FileHandle& h) { return h.file->notes(); });
}

void bind_path_lock(nb::module_& m) {
  nb::class_<LockHandle>(m, "PathLock", "The publish lock of a checkpoint path (load/path_lock.h).")
      .def(
          "__init__",
          [](LockHandle* self, nb::handle path, nb::handle lock, nb::handle holder) {
            new (self) LockHandle{std::make_shared<load::PathLock>(path_arg(path, "path"), path_arg(lock, "lock"),
                                                                   str_arg(holder, "holder"))};
          },
          "path"_a, "lock"_a, "holder"_a)
      .def("acquire", &acquire, "timeout"_a,
           "Waits up to timeout seconds for the lock (OSLayerError ETIMEDOUT naming the holder after that).")
      .def("release", [](LockHandle& h) { h.lock->release(); })
      .def_prop_ro("held", [](LockHandle& h) { return h.lock->held(); });
}

// Calls on paths that a save makes around its files: fsyncs, unlink, the mode
// a replacing file gets.
void bind_path_calls(nb::module_& m) {
  m.def(
      "sync_directory",
      [](nb::handle directory) {
        const std::string d = path_arg(directory, "directory");
        Unlocked unlocked("sync_directory");
        load::sync_directory(d);
      },
      "directory"_a, "fsync a directory, so that the renames in it survive a crash.");
  m.def(
      "remove_file",
      [](nb::handle path) {
        const std::string p = path_arg(path, "path");
        int err;
        {
          Unlocked unlocked("remove_file");
          err = os::remove_path(p.c_str());
        }
        if (err != 0 && err != ENOENT) throw OsError("unlink of " + p, err);
        return err == 0;
      },
      "path"_a, "unlink(path): True if removed, False if nothing was there; OSLayerError otherwise.");
  m.def(
      "sync_file",
      [](nb::handle path) {
        const std::string p = path_arg(path, "path");
        Unlocked unlocked("sync_file");
        if (int err = os::sync_path(p.c_str())) throw OsError("fsync of " + p, err);
      },
      "path"_a, "fsync a file (or a directory) by its path.");
  m.def(
      "replaced_mode",
      [](nb::handle like) {
        const load::ReplacedMode r = load::mode_of(paths_arg(like, "like"));
        return nb::make_tuple(r.mode, r.uid < 0 ? nb::none() : nb::cast(r.uid),
                              r.gid < 0 ? nb::none() : nb::cast(r.gid));
      },
      "like"_a, "(permission bits, uid, gid) a file replacing the first regular file of like gets (uid None: new).");
}

}  // namespace

void bind_write_pipeline(nb::module_& m) {
  bind_atomic_file(m);
  bind_path_lock(m);
  bind_path_calls(m);
}

}  // namespace ferry::python
