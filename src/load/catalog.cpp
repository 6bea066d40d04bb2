// catalog.cpp — read_catalog: the headers read and parsed by up to
// kCatalogThreads threads (a sharded checkpoint's headers are independent),
// then the duplicate and index checks through one hash map of names.
#include "load/catalog.h"

#include <algorithm>
#include <exception>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "os/sysfs.h"

namespace ferry::load {
namespace {

void append(Catalog& c, uint32_t file, const SafetensorsHeader& h) {
  for (const TensorEntry& t : h.tensors) {
    c.names.push_back(t.name);
    c.file.push_back(file);
    c.dtype.push_back(t.dtype);
    c.offset.push_back(h.data_offset + t.begin);
    c.bytes.push_back(t.end - t.begin);
    c.shape.insert(c.shape.end(), t.shape.begin(), t.shape.end());
    c.shape_at.push_back(static_cast<uint32_t>(c.shape.size()));
  }
}

void check_index(const Catalog& c, const std::unordered_map<std::string_view, size_t>& where,
                 std::span<const std::string> files, std::span<const std::string> tensors,
                 std::span<const uint32_t> index_files) {
  if (tensors.size() != index_files.size())
    throw InvalidArgument("catalog: " + std::to_string(tensors.size()) + " index tensors but " +
                          std::to_string(index_files.size()) + " index files");
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (index_files[k] >= files.size())
      throw InvalidArgument("catalog: index entry " + std::to_string(k) + " names file " +
                            std::to_string(index_files[k]) + " of " + std::to_string(files.size()));
    auto it = where.find(tensors[k]);
    if (it != where.end() && c.file[it->second] == index_files[k]) continue;
    const std::string found = it == where.end() ? "no file has it" : "it is in " + files[c.file[it->second]];
    throw InvalidArgument("the shard index maps tensor '" + tensors[k] + "' to " + files[index_files[k]] + ", but " +
                          found);
  }
}

// Every file's header; the error of the first file (in order) that fails.
// Thread k parses files k, k + n, ...: no shared state but its own slots.
std::vector<SafetensorsHeader> read_headers(std::span<const std::string> files) {
  std::vector<SafetensorsHeader> headers(files.size());
  std::vector<std::exception_ptr> errors(files.size());
  const size_t n = std::min<size_t>(files.size(), static_cast<size_t>(std::clamp(os::usable_cores(), 1, kCatalogThreads)));
  auto work = [&](size_t k) {
    for (size_t f = k; f < files.size(); f += n) {
      try {
        headers[f] = read_safetensors_header(files[f]);
      } catch (...) {
        errors[f] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  try {
    for (size_t k = 1; k < n; ++k) threads.emplace_back(work, k);
  } catch (...) {  // no thread: this one does the rest (work(k) for each k never started)
    for (size_t k = threads.size() + 1; k < n; ++k) work(k);
  }
  work(0);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return headers;
}

}  // namespace

Catalog read_catalog(std::span<const std::string> files, std::span<const std::string> index_tensors,
                     std::span<const uint32_t> index_files) {
  Catalog c;
  c.shape_at.push_back(0);
  const std::vector<SafetensorsHeader> headers = read_headers(files);
  for (size_t f = 0; f < files.size(); ++f) append(c, static_cast<uint32_t>(f), headers[f]);
  for (const SafetensorsHeader& h : headers) c.identity.push_back(h.identity);
  std::unordered_map<std::string_view, size_t> where;  // views of c.names: no reallocation after this point
  where.reserve(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    auto [it, fresh] = where.emplace(c.names[i], i);
    if (!fresh)
      throw InvalidArgument("tensor '" + c.names[i] + "' is in two files: " + files[c.file[it->second]] + " and " +
                            files[c.file[i]]);
  }
  check_index(c, where, files, index_tensors, index_files);
  return c;
}

}  // namespace ferry::load
