// load_bindings.cpp — ferry._ferry.Loader and the safetensors parsers
// (read_safetensors_header, parse_safetensors_header, parse_shard_index,
// shard_index_columns, read_catalog: the last two as columns, a few lists
// whatever the number of tensors).
// Ranges are parallel lists of ints; python/ferry/load.py and
// python/ferry/torch/safetensors.py build them from tensors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/options.h"
#include "cuda/load/file_loader.h"
#include "load/catalog.h"
#include "load/pipeline.h"
#include "load/safetensors.h"
#include "python/args.h"
#include "python/copy_args.h"
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
    for (size_t i = 0; i < h.metadata_keys.size(); ++i) {
      const std::string_view k = h.metadata_keys[i], v = h.metadata_values[i];
      md[nb::str(k.data(), k.size())] = nb::str(v.data(), v.size());
    }
    d["metadata"] = md;
  } else {
    d["metadata"] = nb::none();
  }
  return d;
}

// (device, inode, size, mtime_ns) per file: what Python compares.
nb::list identities(const std::vector<os::FileIdentity>& ids) {
  nb::list out;
  for (const os::FileIdentity& i : ids) out.append(nb::make_tuple(i.device, i.inode, i.size, i.mtime_ns));
  return out;
}

// Messages that may name files that are not UTF-8: such bytes appear as \xNN.
nb::list messages(const std::vector<std::string>& texts) {
  nb::list out;
  for (const std::string& n : texts)
    out.append(nb::steal(PyUnicode_DecodeUTF8(n.data(), static_cast<Py_ssize_t>(n.size()), "backslashreplace")));
  return out;
}

nb::dict stats_dict(const cuda::LoadStats& s) {
  nb::dict d;
  d["bytes"] = s.range_bytes;
  d["read_bytes"] = s.read_bytes;
  d["staged_bytes"] = s.staged_bytes;
  d["reads"] = s.reads;
  d["direct_reads"] = s.direct_reads;
  d["seconds"] = s.seconds;
  d["staging_bytes"] = s.staging_bytes;
  d["threads"] = s.threads;
  d["numa_node"] = s.numa_node;
  d["notes"] = messages(s.notes);
  d["identities"] = identities(s.identities);
  d["changed"] = messages(s.changed);
  return d;
}

cuda::Progress progress_of(nb::handle h) {
  if (h.is_none()) return cuda::Progress::automatic;
  return bool_arg(h, "progress") ? cuda::Progress::always : cuda::Progress::never;
}

// The bytes of a bytes-like object (bytes, bytearray, memoryview, numpy array).
std::vector<uint8_t> bytes_arg(nb::handle value, const char* name) {
  Py_buffer view;
  if (PyUnicode_Check(value.ptr()) || PyObject_GetBuffer(value.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + "=" + arg_repr(value) + ": expected bytes or a bytes-like object");
  }
  const auto* p = static_cast<const uint8_t*>(view.buf);
  std::vector<uint8_t> out(p, p + view.len);
  PyBuffer_Release(&view);
  return out;
}

// A list of paths, any a path the OS takes (str, bytes, os.PathLike): files[i]
// named in the error of a bad one.
std::vector<std::string> paths_arg(nb::handle files_arg) {
  nb::list file_items = items_arg(files_arg, "files", "a list of paths");
  std::vector<std::string> files;
  for (size_t i = 0; i < file_items.size(); ++i)
    files.push_back(path_arg(file_items[i], ("files[" + std::to_string(i) + "]").c_str()));
  return files;
}

// The catalog as columns: a few lists whatever the number of tensors.
nb::dict catalog_dict(const load::Catalog& c) {
  nb::list names, dtypes, shapes;
  nb::str dtype_names[static_cast<size_t>(load::Dtype::count_)];
  for (size_t d = 0; d < static_cast<size_t>(load::Dtype::count_); ++d)
    dtype_names[d] = nb::str(load::dtype_name(static_cast<load::Dtype>(d)));
  for (size_t i = 0; i < c.size(); ++i) {
    names.append(fs_str(c.names[i]));
    dtypes.append(dtype_names[static_cast<size_t>(c.dtype[i])]);
    nb::tuple shape = nb::steal<nb::tuple>(PyTuple_New(c.shape_at[i + 1] - c.shape_at[i]));
    for (uint32_t k = c.shape_at[i]; k < c.shape_at[i + 1]; ++k)
      PyTuple_SET_ITEM(shape.ptr(), k - c.shape_at[i], PyLong_FromUnsignedLongLong(c.shape[k]));
    shapes.append(shape);
  }
  nb::dict d;
  d["names"] = names;
  d["file"] = c.file;
  d["dtype"] = dtypes;
  d["shape"] = shapes;
  d["offset"] = c.offset;
  d["nbytes"] = c.bytes;
  d["identity"] = identities(c.identity);
  return d;
}

nb::dict catalog_columns(nb::handle files_arg, nb::handle index_tensors_arg, nb::handle index_files_arg) {
  const std::vector<std::string> files = paths_arg(files_arg);
  nb::list tensor_items = items_arg(index_tensors_arg, "index_tensors", "a list of tensor names");
  std::vector<std::string> index_tensors;
  for (size_t i = 0; i < tensor_items.size(); ++i)
    index_tensors.push_back(text_arg(tensor_items[i], ("index_tensors[" + std::to_string(i) + "]").c_str()));
  std::vector<uint32_t> index_files;
  for (uintptr_t f : addresses(index_files_arg, "index_files")) {
    if (f >= files.size())
      throw InvalidArgument("read_catalog: index_files names file " + std::to_string(f) + " of " +
                            std::to_string(files.size()));
    index_files.push_back(static_cast<uint32_t>(f));
  }
  load::Catalog c;
  {
    GilRelease unlocked;
    c = load::read_catalog(files, index_tensors, index_files);
  }
  return catalog_dict(c);
}

void loader_init(cuda::Loader* l, nb::handle device, nb::handle staging_bytes, nb::handle slot_bytes,
                 nb::handle threads, nb::handle direct_io, nb::handle progress) {
  cuda::LoaderOptions o = cuda::LoaderOptions::from_environment(int_arg<int>(device, "device", 0, INT32_MAX));
  if (!staging_bytes.is_none()) o.staging_bytes = size_arg(staging_bytes, "staging_bytes");
  if (!slot_bytes.is_none()) o.slot_bytes = size_arg(slot_bytes, "slot_bytes");
  if (!threads.is_none()) o.threads = int_arg<int>(threads, "threads", 0, static_cast<int>(kMaxThreads));
  if (!direct_io.is_none()) o.direct_io = load::parse_direct_io(str_arg(direct_io, "direct_io"));
  o.progress = progress_of(progress);
  GilRelease unlocked;
  new (l) cuda::Loader(o);
}

// Loader.load: ranges as parallel lists of ints (file_index, offsets, sizes, dsts).
nb::dict loader_load(cuda::Loader& l, nb::handle files_arg, nb::handle file_index_arg, nb::handle offsets_arg,
                     nb::handle sizes_arg, nb::handle dsts_arg, nb::handle stream_arg) {
  const std::vector<std::string> files = paths_arg(files_arg);
  const std::vector<uintptr_t> file_index = addresses(file_index_arg, "file_index"),
                               offsets = addresses(offsets_arg, "offsets"), sizes = addresses(sizes_arg, "sizes"),
                               dsts = addresses(dsts_arg, "dsts");
  const uintptr_t stream = int_arg<uintptr_t>(stream_arg, "stream");
  if (file_index.size() != offsets.size() || offsets.size() != sizes.size() || sizes.size() != dsts.size())
    throw InvalidArgument("load: file_index, offsets, sizes and dsts must have the same length");
  std::vector<load::FileRange> ranges(sizes.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (file_index[i] >= files.size())
      throw InvalidArgument("file_index[" + std::to_string(i) + "]=" + std::to_string(file_index[i]) +
                            ": there are " + std::to_string(files.size()) + " files");
    ranges[i] = {static_cast<uint32_t>(file_index[i]), offsets[i], sizes[i], dsts[i]};
  }
  cuda::LoadStats st;
  {
    GilRelease unlocked;
    st = l.load(files, ranges, reinterpret_cast<cudaStream_t>(stream));
  }
  return stats_dict(st);
}

// The safetensors header and the shard index (model.safetensors.index.json).
// Arguments here and below are nb::handle, checked by args.h: a wrong type is
// an InvalidArgumentError naming the argument; paths are taken as
// os.fsencode() spells them, so names that are not UTF-8 work.
void bind_safetensors(nb::module_& m) {
  m.def("read_safetensors_header",
        [](nb::handle path_arg_) {
          const std::string path = path_arg(path_arg_, "path");
          load::SafetensorsHeader h;
          {
            GilRelease unlocked;
            h = load::read_safetensors_header(path);
          }
          return header_dict(h);
        },
        "path"_a.none(), "Parse a safetensors file's header (strict; InvalidArgumentError names the file and tensor).");
  m.def("parse_safetensors_header",
        [](nb::handle data, nb::handle name) {
          const std::vector<uint8_t> bytes = bytes_arg(data, "data");
          return header_dict(load::parse_safetensors_header(bytes, bytes.size(), text_arg(name, "name")));
        },
        "data"_a.none(), "name"_a.none() = "<bytes>", "Parse a whole safetensors file held in memory.");
  m.def("parse_shard_index",
        [](nb::handle text, nb::handle name) {
          load::ShardIndex idx = load::parse_shard_index(text_arg(text, "text"), text_arg(name, "name"));
          nb::list pairs;  // names as os.fsdecode() makes them: os.path.join and open() take them back
          for (size_t k = 0; k < idx.tensors.size(); ++k)
            pairs.append(nb::make_tuple(fs_str(idx.tensors[k]), fs_str(idx.shards[idx.shard_of[k]])));
          return pairs;
        },
        "text"_a.none(), "name"_a.none(), "[(tensor, shard file)] of a model.safetensors.index.json text (str or bytes).");

  m.def("shard_index_columns",
        [](nb::handle text, nb::handle name) {
          load::ShardIndex idx = load::parse_shard_index(text_arg(text, "text"), text_arg(name, "name"));
          nb::list shards, tensors, shard_of;  // names as os.fsdecode() makes them (os.path.join takes them)
          for (std::string_view file : idx.shards) shards.append(fs_str(file));
          for (std::string_view tensor : idx.tensors) tensors.append(fs_str(tensor));
          for (uint32_t shard : idx.shard_of) shard_of.append(shard);
          return nb::make_tuple(shards, tensors, shard_of);
        },
        "text"_a.none(), "name"_a.none(),
        "(shards, tensors, shard_of): tensors[k] is in shards[shard_of[k]], shards in first-seen order.");
}

// What the loader asks of a set of files before it reads: page cache shares,
// every tensor's place.
void bind_catalog(nb::module_& m) {
  m.def("page_cache_shares",
        [](nb::handle files_arg) {
          const std::vector<std::string> files = paths_arg(files_arg);
          std::vector<double> shares;
          {
            GilRelease unlocked;
            shares = load::page_cache_shares(files);
          }
          return shares;
        },
        "files"_a,
        "The share (0..1) of each file in the page cache (the loader's probe: 64 one-byte RWF_NOWAIT reads); "
        "-1 where the file system cannot say.");
  m.def("read_catalog", &catalog_columns,
        "files"_a.none(), "index_tensors"_a.none(), "index_files"_a.none(),
        "Every tensor of the files as columns {names, file, dtype, shape, offset (from the file's start), nbytes}, "
        "checked: headers, unique names, the index (index_tensors[k] in files[index_files[k]]).");
}

// The checkpoint loader (cuda/load/file_loader.h).
void bind_loader_class(nb::module_& m) {
  nb::class_<cuda::Loader>(m, "Loader")
      .def("__init__", &loader_init,
           "device"_a.none() = 0, "staging_bytes"_a.none() = nb::none(), "slot_bytes"_a.none() = nb::none(),
           "threads"_a.none() = nb::none(), "direct_io"_a.none() = nb::none(), "progress"_a.none() = nb::none())
      .def("load", &loader_load,
           "files"_a.none(), "file_index"_a.none(), "offsets"_a.none(), "sizes"_a.none(), "dsts"_a.none(),
           "stream"_a.none() = 0)
      .def_prop_ro("device", [](const cuda::Loader& l) { return l.options().device; })
      .def_prop_ro("staging_bytes", [](const cuda::Loader& l) { return l.options().staging_bytes; })
      .def_prop_ro("slot_bytes", [](const cuda::Loader& l) { return l.options().slot_bytes; })
      .def_prop_ro("threads", [](const cuda::Loader& l) { return l.options().threads; })
      .def_prop_ro("direct_io",
                   [](const cuda::Loader& l) { return std::string(load::direct_io_name(l.options().direct_io)); });
}

}  // namespace

void bind_load(nb::module_& m) {
  bind_safetensors(m);
  bind_catalog(m);
  bind_loader_class(m);
}

}  // namespace ferry::python
