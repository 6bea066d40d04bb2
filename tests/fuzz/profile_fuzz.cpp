// profile_fuzz.cpp — the copy engine's machine profile file (src/copy/strategy.cpp).
// Invariants: an accepted profile is within the documented ranges, and what
// format_profile() writes of it parses back to the same profile.
#include <cmath>

#include "copy/strategy.h"
#include "core/options.h"
#include "fuzz_common.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MachineProfile p;
  if (!fuzz::accepted([&] { p = parse_profile(fuzz::text(data, size)); })) return 0;
  fuzz::require(p.staging_slots >= 2 && p.staging_slots <= kMaxStagingSlots, "staging_slots out of range");
  fuzz::require(p.workers >= 0 && p.workers <= kMaxThreads, "workers out of range");
  fuzz::require(p.staging_chunk_bytes >= 4096 && p.staging_chunk_bytes <= kMaxStagingChunkBytes,
                "staging_chunk_bytes out of range");
  fuzz::require(p.pin_piece_bytes % (2u << 20) == 0 && p.pin_piece_bytes <= kMaxPinPieceBytes,
                "pin_piece_bytes out of range");
  for (double share : p.hybrid_pinned_share) fuzz::require(share >= 0 && share <= 1, "a share out of 0..1");
  fuzz::require(p.eager_slots >= 1 && p.eager_slots <= 4096 && p.eager_areas >= 1 && p.eager_areas <= 64 &&
                    p.eager_chunk_bytes >= 1 && p.eager_chunk_bytes <= kMaxStagingChunkBytes,
                "eager geometry out of range");
  MachineProfile q;
  fuzz::require(fuzz::accepted([&] { q = parse_profile(format_profile(p)); }), "a formatted profile is refused");
  fuzz::require(q.cuda_below_bytes[0] == p.cuda_below_bytes[0] && q.cuda_below_bytes[1] == p.cuda_below_bytes[1] &&
                    q.staging_chunk_bytes == p.staging_chunk_bytes && q.eager_chunk_bytes == p.eager_chunk_bytes &&
                    q.eager_slots == p.eager_slots && q.eager_areas == p.eager_areas &&
                    q.eager_async_below_bytes == p.eager_async_below_bytes &&
                    q.staging_slots == p.staging_slots && q.workers == p.workers &&
                    q.hybrid_below_bytes == p.hybrid_below_bytes && q.pin_piece_bytes == p.pin_piece_bytes &&
                    q.batch_sm_below_bytes == p.batch_sm_below_bytes,
                "a profile does not survive format and parse");
  for (int d = 0; d < 2; ++d)
    fuzz::require(std::fabs(q.hybrid_pinned_share[d] - p.hybrid_pinned_share[d]) < 1e-5, "a share drifted");
  return 0;
}
