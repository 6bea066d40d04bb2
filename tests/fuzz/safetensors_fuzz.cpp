// safetensors_fuzz.cpp — the safetensors header parser (src/load/safetensors.cpp)
// on any bytes, taken as a whole file. Invariants of an accepted file: the
// tensors, in file order, tile the data section exactly (no gap, no overlap,
// the last one ends at the end of the file), each holds its shape's bytes,
// each metadata key has its value, and the non-throwing entry point agrees with
// the throwing one.
#include <span>

#include "fuzz_common.h"
#include "load/safetensors.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  load::SafetensorsHeader h;
  const bool ok = fuzz::accepted([&] { h = load::parse_safetensors_header(std::span(data, size), size, "fuzz"); });
  std::string error;
  const int status = load::parse_safetensors_header(data, size, nullptr, &error);
  fuzz::require(ok == (status == 0), "the two entry points disagree");
  fuzz::require(ok || !error.empty(), "a rejection without a message");
  if (!ok) return 0;
  fuzz::require(h.data_offset == 8 + h.header_bytes && h.data_offset <= size, "data offset");
  fuzz::require(h.metadata_keys.size() == h.metadata_values.size(), "a metadata key without its value");
  fuzz::require(h.has_metadata || h.metadata_keys.empty(), "metadata without \"__metadata__\"");
  uint64_t end = 0;
  for (const load::TensorEntry& t : h.tensors) {
    fuzz::require(t.begin == end, "tensors do not tile the data section");
    uint64_t elements = 1;
    for (uint64_t d : t.shape) elements *= d;  // no overflow: the parser checked it
    fuzz::require(elements * load::dtype_bits(t.dtype) / 8 == t.end - t.begin, "bytes differ from the shape's");
    end = t.end;
  }
  fuzz::require(h.data_offset + end == size, "the tensors do not end at the end of the file");
  return 0;
}
