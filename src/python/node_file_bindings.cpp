// node_file_bindings.cpp — the node load's protocol (node/node_file.h) for
// python/ferry/torch/node_load.py: NodeFileRead(path, name) opens the file,
// join() makes or finds its block and starts this rank's reads, wait_piece()
// and finish() wait for the other ranks (the GIL released). A NodeLoadTimeout
// becomes ferry.errors.NodeLoadTimeoutError (FERRY_ERROR_TIMEOUT alone would
// name the handoff's class).
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <memory>
#include <string>

#include "node/node_file.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {

using node::NodeFileRead;

namespace {

// Runs fn with the GIL released; a NodeLoadTimeout is raised as its Python class.
template <class Fn>
void waiting(Fn&& fn) {
  try {
    GilRelease unlocked;
    fn();
  } catch (const node::NodeLoadTimeout& e) {
    nb::object cls = nb::module_::import_("ferry.errors").attr("NodeLoadTimeoutError");
    PyErr_SetString(cls.ptr(), e.what());
    throw nb::python_error();
  }
}

nb::dict stats_dict(const NodeFileRead& f) {
  const node::NodeFileStats s = f.stats();
  nb::dict d;
  d["part"] = nb::make_tuple(s.part_begin, s.part_end);
  d["bytes_read"] = s.part_end - s.part_begin;
  d["read_seconds"] = s.read_seconds < 0 ? nb::none() : nb::cast(s.read_seconds);
  d["wait_seconds"] = s.wait_seconds < 0 ? nb::none() : nb::cast(s.wait_seconds);
  d["made_block"] = s.made_block;
  return d;
}

}  // namespace

void bind_node_file(nb::module_& m) {
  m.attr("NODE_FILE_HEADER_BYTES") = node::kNodeFileHeaderBytes;
  m.attr("NODE_FILE_MAX_RANKS") = node::kNodeFileMaxRanks;
  m.attr("NODE_FILE_MAX_PIECES") = node::kNodeFileMaxPieces;
  m.attr("NODE_FILE_MIN_PIECE") = node::kNodeFileMinPiece;
  m.def("node_file_piece_bytes", &node::node_file_piece_bytes, "size"_a);
  m.def("node_file_parts", &node::node_file_parts, "size"_a, "ranks"_a);

  nb::class_<NodeFileRead>(m, "NodeFileRead")
      .def("__init__",
           [](NodeFileRead* f, const std::string& path, const std::string& name) {
             GilRelease unlocked;  // a slow file system's open
             new (f) NodeFileRead(path, name);
           },
           "path"_a, "name"_a)
      .def_prop_ro("identity",
                   [](const NodeFileRead& f) {
                     const os::FileIdentity& id = f.identity();
                     return nb::make_tuple(id.device, id.inode, id.size, id.mtime_ns);
                   })
      .def("join",
           [](NodeFileRead& f, std::shared_ptr<node::NodePool> pool, const std::string& key, uint32_t rank,
              uint32_t ranks, double timeout_s, int read_threads) {
             waiting([&] { f.join(std::move(pool), key, rank, ranks, timeout_s, read_threads); });
           },
           "pool"_a, "key"_a, "rank"_a, "ranks"_a, "timeout_s"_a, "read_threads"_a)
      .def_prop_ro("size", &NodeFileRead::size)
      .def_prop_ro("piece_bytes", &NodeFileRead::piece_bytes)
      .def_prop_ro("piece_count", &NodeFileRead::piece_count)
      .def_prop_ro("handle", [](const NodeFileRead& f) { return f.block().offset; })
      .def_prop_ro("block_bytes", [](const NodeFileRead& f) { return f.block().bytes; })
      .def_prop_ro("address", [](const NodeFileRead& f) { return reinterpret_cast<uintptr_t>(f.data()); })
      .def("stats", &stats_dict)
      .def("wait_piece", [](NodeFileRead& f, uint32_t p) { waiting([&] { f.wait_piece(p); }); }, "piece"_a)
      .def("finish", [](NodeFileRead& f) { waiting([&] { f.finish(); }); })
      .def("release", [](NodeFileRead& f) {
        GilRelease unlocked;  // waits for the span being read
        f.release();
      });
}

}  // namespace ferry::python
