// load_bindings.cpp — ferry._ferry.Loader and the safetensors parsers
// (read_safetensors_header, parse_safetensors_header, parse_shard_index).
// Ranges are parallel lists of ints; python/ferry/load.py and
// python/ferry/torch/safetensors.py build them from tensors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/load/file_loader.h"
#include "load/safetensors.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {
namespace {

nb::dict header_dict(const load::SafetensorsHeader& h) {
  nb::dict d;
  d["header_bytes"] = h.header_bytes;
  d["data_offset"] = h.data_offset;
  d["file_bytes"] = h.file_bytes;
  nb::list tensors;
  for (const auto& t : h.tensors) {
    nb::list shape;
    for (uint64_t s : t.shape) shape.append(s);
    // (name, dtype, shape, begin, end): offsets relative to the data section
    tensors.append(nb::make_tuple(t.name, load::dtype_name(t.dtype), shape, t.begin, t.end));
  }
  d["tensors"] = tensors;
  if (h.has_metadata) {
    nb::dict md;
    for (const auto& [k, v] : h.metadata) md[nb::str(k.c_str(), k.size())] = nb::str(v.c_str(), v.size());
    d["metadata"] = md;
  } else {
    d["metadata"] = nb::none();
  }
  return d;
}

nb::dict stats_dict(const cuda::LoadStats& s) {
  nb::dict d;
  d["bytes"] = s.range_bytes;
  d["read_bytes"] = s.read_bytes;
  d["staged_bytes"] = s.staged_bytes;
  d["mapped_bytes"] = s.mapped_bytes;
  d["reads"] = s.reads;
  d["direct_reads"] = s.direct_reads;
  d["registrations"] = s.registrations;
  d["seconds"] = s.seconds;
  d["register_seconds"] = s.register_seconds;
  d["unregister_seconds"] = s.unregister_seconds;
  d["staging_bytes"] = s.staging_bytes;
  d["threads"] = s.threads;
  d["notes"] = s.notes;
  return d;
}

cuda::Progress progress_of(nb::handle h) {
  if (h.is_none()) return cuda::Progress::automatic;
  return nb::cast<bool>(h) ? cuda::Progress::always : cuda::Progress::never;
}

}  // namespace

void bind_load(nb::module_& m) {
  m.def("read_safetensors_header",
        [](const std::string& path) {
          load::SafetensorsHeader h;
          {
            ferry::python::GilRelease unlocked;
            h = load::read_safetensors_header(path);
          }
          return header_dict(h);
        },
        "path"_a, "Parse a safetensors file's header (strict; InvalidArgumentError names the file and tensor).");
  m.def("parse_safetensors_header",
        [](nb::bytes data, const std::string& name) {
          auto* p = static_cast<const uint8_t*>(data.data());
          return header_dict(load::parse_safetensors_header(std::span<const uint8_t>(p, data.size()), data.size(), name));
        },
        "data"_a, "name"_a = "<bytes>", "Parse a whole safetensors file held in memory.");
  m.def("parse_shard_index",
        [](const std::string& text, const std::string& name) {
          load::ShardIndex idx = load::parse_shard_index(text, name);
          nb::list pairs;
          for (const auto& [tensor, file] : idx.weight_map) pairs.append(nb::make_tuple(tensor, file));
          return pairs;
        },
        "text"_a, "name"_a, "[(tensor, shard file)] of a model.safetensors.index.json text.");

  nb::class_<cuda::Loader>(m, "Loader")
      .def("__init__",
           [](cuda::Loader* l, int device, nb::handle staging_bytes, nb::handle slot_bytes, nb::handle threads,
              nb::handle direct_io, nb::handle mapped_share, nb::handle progress) {
             cuda::LoaderOptions o = cuda::LoaderOptions::from_environment(device);
             if (!staging_bytes.is_none()) o.staging_bytes = nb::cast<size_t>(staging_bytes);
             if (!slot_bytes.is_none()) o.slot_bytes = nb::cast<size_t>(slot_bytes);
             if (!threads.is_none()) o.threads = nb::cast<int>(threads);
             if (!direct_io.is_none()) o.direct_io = load::parse_direct_io(nb::cast<std::string>(direct_io));
             if (!mapped_share.is_none()) o.mapped_share = nb::cast<double>(mapped_share);
             o.progress = progress_of(progress);
             ferry::python::GilRelease unlocked;
             new (l) cuda::Loader(o);
           },
           "device"_a = 0, "staging_bytes"_a = nb::none(), "slot_bytes"_a = nb::none(), "threads"_a = nb::none(),
           "direct_io"_a = nb::none(), "mapped_share"_a = nb::none(), "progress"_a = nb::none())
      .def("load",
           [](cuda::Loader& l, std::vector<std::string> files, std::vector<uint32_t> file_index,
              std::vector<uint64_t> offsets, std::vector<uint64_t> sizes, std::vector<uintptr_t> dsts,
              uintptr_t stream) {
             if (file_index.size() != offsets.size() || offsets.size() != sizes.size() || sizes.size() != dsts.size())
               throw InvalidArgument("load: file_index, offsets, sizes and dsts must have the same length");
             std::vector<load::FileRange> ranges(sizes.size());
             for (size_t i = 0; i < ranges.size(); ++i) ranges[i] = {file_index[i], offsets[i], sizes[i], dsts[i]};
             cuda::LoadStats st;
             {
               ferry::python::GilRelease unlocked;
               st = l.load(files, ranges, reinterpret_cast<cudaStream_t>(stream));
             }
             return stats_dict(st);
           },
           "files"_a, "file_index"_a, "offsets"_a, "sizes"_a, "dsts"_a, "stream"_a = 0)
      .def_prop_ro("device", [](const cuda::Loader& l) { return l.options().device; })
      .def_prop_ro("staging_bytes", [](const cuda::Loader& l) { return l.options().staging_bytes; })
      .def_prop_ro("slot_bytes", [](const cuda::Loader& l) { return l.options().slot_bytes; })
      .def_prop_ro("threads", [](const cuda::Loader& l) { return l.options().threads; })
      .def_prop_ro("direct_io", [](const cuda::Loader& l) { return std::string(load::direct_io_name(l.options().direct_io)); })
      .def_prop_ro("mapped_share", [](const cuda::Loader& l) { return l.options().mapped_share; });
}

}  // namespace ferry::python
