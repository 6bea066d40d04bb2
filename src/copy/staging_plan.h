// staging_plan.h — how a list of host<->device items moves through one staging
// area when the host issues each DMA as soon as its chunk is staged (the
// "eager" staged copy, cuda/copy/eager_copy.h). Pure arithmetic on sizes, no memory
// behind it: tested table-driven on any machine.
//
// The area is `slots` chunks of `chunk_bytes`; chunk k of a plan uses slot
// k % slots, so a plan longer than the area reuses slots once the chunk before
// them is done. Items fill chunks in order: a big item is cut across chunks,
// small items share one (each fragment starts on a kFragmentAlign boundary, so
// that threads filling neighbouring fragments never write the same cache line).
// Every fragment of an item inside one chunk is one DMA; fragments are cut into
// pieces of at most piece_bytes, the unit one CPU thread copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ferry {

constexpr size_t kFragmentAlign = 256;

struct StagingGeometry {
  size_t chunk_bytes = 2u << 20;  // one slot of the area; the largest DMA
  uint32_t slots = 16;            // chunks in the area
  size_t piece_bytes = 256u << 10;  // the most one thread copies at a time
};

struct PlanPiece {
  uint32_t item = 0;
  uint32_t chunk = 0;
  size_t item_offset = 0;
  size_t area_offset = 0;  // from the start of the area
  size_t bytes = 0;
  bool operator==(const PlanPiece&) const = default;
};

struct PlanDma {
  uint32_t item = 0;
  size_t item_offset = 0;
  size_t area_offset = 0;
  size_t bytes = 0;
  bool operator==(const PlanDma&) const = default;
};

struct PlanChunk {
  uint32_t first_piece = 0, pieces = 0;  // its pieces are consecutive in StagingPlan::pieces
  uint32_t first_dma = 0, dmas = 0;      // and its DMAs in StagingPlan::dmas
  uint32_t slot = 0;
};

struct StagingPlan {
  std::vector<PlanChunk> chunks;
  std::vector<PlanPiece> pieces;
  std::vector<PlanDma> dmas;
};

// Items of 0 bytes get nothing. Preconditions: chunk_bytes, slots, piece_bytes
// > 0; chunk_bytes a multiple of kFragmentAlign.
StagingPlan plan_staging(std::span<const size_t> item_bytes, const StagingGeometry& geometry);

// Pieces sized to the copy: small enough that every one of `threads` threads
// gets about two pieces of each chunk (so a chunk is staged in one round of the
// crew), large enough that a memcpy call's fixed cost stays small (>= 16 KiB),
// at most 256 KiB, a multiple of 4 KiB.
size_t piece_bytes_for(size_t total_bytes, size_t chunk_bytes, int threads);

}  // namespace ferry
