// write_pipeline_bindings.cpp — load/write_pipeline.h for save's ring
// (python/ferry/torch/save.py): write_file_range(...) writes a file's range
// from slots that a Python callable fills.
//
// GIL: released for the whole run; fill, the one Python call, takes it back
// on the caller's thread. The writers never take it. An OS error becomes an
// OSLayerError carrying its errno; an exception raised by fill comes back as
// it was raised.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/worker_pool.h"
#include "load/write_pipeline.h"
#include "python/args.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {
namespace {

// Slots at Python's addresses; fill(slot, file_offset, n) puts the bytes in
// the slot and returns None, or returns the address of memory that already
// holds them (a snapshot's), which is then written instead.
class PySource final : public load::Source {
 public:
  PySource(std::vector<uintptr_t> slots, size_t slot_bytes, nb::callable fill)
      : slots_(std::move(slots)), at_(slots_), slot_bytes_(slot_bytes), fill_(std::move(fill)) {}
  size_t slot_count() const override { return slots_.size(); }
  size_t slot_bytes() const override { return slot_bytes_; }
  const unsigned char* slot(size_t i) const override { return reinterpret_cast<const unsigned char*>(at_[i]); }
  void fill(size_t i, uint64_t file_offset, size_t n) override {
    GilTakeBack gil;  // not nb::gil_scoped_acquire: safe at interpreter exit (gil.h)
    nb::object where = fill_(i, file_offset, n);
    at_[i] = where.is_none() ? slots_[i] : int_arg<uintptr_t>(where, "fill's result");
  }

 private:
  std::vector<uintptr_t> slots_;
  std::vector<uintptr_t> at_;  // where slot i's bytes are since its last fill
  size_t slot_bytes_;
  nb::callable fill_;
};

}  // namespace

void bind_write_pipeline(nb::module_& m) {
  m.def(
      "write_file_range",
      [](nb::handle fd, nb::handle direct, nb::handle path, nb::handle name, nb::handle offset, nb::handle nbytes,
         nb::handle slots, nb::handle slot_bytes, nb::callable fill, nb::handle writers) {
        load::WriteFile f;
        f.fd = int_arg<int>(fd, "fd", 0);
        f.direct = bool_arg(direct, "direct");
        f.path = path_arg(path, "path");
        f.name = str_arg(name, "name");
        f.offset = int_arg<uint64_t>(offset, "offset");
        f.bytes = int_arg<uint64_t>(nbytes, "nbytes");
        std::vector<uintptr_t> addresses;
        for (nb::handle a : items_arg(slots, "slots", "a list of slot addresses"))
          addresses.push_back(int_arg<uintptr_t>(a, "slots[i]"));
        PySource source(std::move(addresses), size_arg(slot_bytes, "slot_bytes"), std::move(fill));
        const int threads = int_arg<int>(writers, "writers", 1, 64);
        load::WriteStats st;
        {  // an OsError reaches Python as OSLayerError with its errno (module.cpp's translator)
          GilRelease unlocked;
          if (!unlocked.released())  // the exit hook ran: fill would run Python under these frames (gil.h)
            throw NotSupported("write_file_range: the interpreter is exiting; a save does not start now");
          WorkerPool pool(threads);
          st = load::run_write_pipeline(f, source, pool, threads);
        }
        nb::dict d;
        d["bytes"] = st.bytes;
        d["writes"] = st.writes;
        d["direct_writes"] = st.direct_writes;
        d["buffered_fd"] = st.buffered_fd;
        d["seconds"] = st.seconds;
        nb::list notes;
        for (const std::string& n : st.notes) notes.append(n);
        d["notes"] = notes;
        return d;
      },
      "fd"_a, "direct"_a, "path"_a, "name"_a, "offset"_a, "nbytes"_a, "slots"_a, "slot_bytes"_a, "fill"_a,
      "writers"_a,
      "Writes bytes [offset, offset + nbytes) of the open file fd from slots that fill(slot, file_offset, n) "
      "fills on this thread, in file order, while writer threads pwrite them (load/write_pipeline.h). "
      "Returns {'bytes', 'writes', 'direct_writes', 'buffered_fd' (the O_DIRECT fallback's descriptor, "
      "now the caller's, or -1), 'seconds', 'notes'}.");
}

}  // namespace ferry::python
