// managed_options_fuzz.cpp — the PyTorch allocators' option strings
// (src/managed/managed_options.cpp), for every allocator kind. Invariant: the
// canonical text of accepted options parses back to the same options.
#include "fuzz_common.h"
#include "managed/managed_options.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = fuzz::text(data, size);
  for (int k = 0; k < kManagedKinds; ++k) {
    const auto kind = static_cast<ManagedKind>(k);
    ManagedOptions o;
    if (!fuzz::accepted([&] { o = parse_managed_options(kind, text); })) continue;
    fuzz::require(o.chunk_bytes > 0 && o.chunk_bytes % (2u << 20) == 0, "chunk_bytes not a multiple of 2 MiB");
    ManagedOptions again;
    fuzz::require(fuzz::accepted([&] { again = parse_managed_options(kind, o.text(kind)); }),
                  "canonical options are refused");
    fuzz::require(again.text(kind) == o.text(kind), "options do not survive text and parse");
  }
  return 0;
}
