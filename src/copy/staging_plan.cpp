// staging_plan.cpp — items -> chunks, DMAs and pieces.
#include "copy/staging_plan.h"

#include <algorithm>

namespace ferry {

namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct Builder {
  const StagingGeometry& g;
  StagingPlan plan;
  size_t used = 0;  // bytes used in the current chunk (aligned fragment starts)

  void open_chunk() {
    PlanChunk c;
    c.first_piece = static_cast<uint32_t>(plan.pieces.size());
    c.first_dma = static_cast<uint32_t>(plan.dmas.size());
    c.slot = static_cast<uint32_t>(plan.chunks.size() % g.slots);
    plan.chunks.push_back(c);
    used = 0;
  }

  // One fragment of an item in the current chunk: one DMA, cut into pieces.
  void add_fragment(uint32_t item, size_t item_offset, size_t bytes) {
    PlanChunk& c = plan.chunks.back();
    const size_t area_offset = c.slot * g.chunk_bytes + used;
    plan.dmas.push_back({item, item_offset, area_offset, bytes});
    ++c.dmas;
    for (size_t done = 0; done < bytes; done += g.piece_bytes) {
      const size_t n = std::min(g.piece_bytes, bytes - done);
      plan.pieces.push_back({item, static_cast<uint32_t>(plan.chunks.size() - 1), item_offset + done,
                             area_offset + done, n});
      ++c.pieces;
    }
    used = align_up(used + bytes, kFragmentAlign);
  }
};

}  // namespace

StagingPlan plan_staging(std::span<const size_t> item_bytes, const StagingGeometry& geometry) {
  Builder b{geometry, {}};
  for (uint32_t item = 0; item < item_bytes.size(); ++item) {
    size_t offset = 0;
    const size_t n = item_bytes[item];
    while (offset < n) {
      if (b.plan.chunks.empty() || b.used >= geometry.chunk_bytes) b.open_chunk();
      const size_t room = geometry.chunk_bytes - b.used;
      // A small item that does not fit the rest of this chunk starts a new one
      // rather than being cut in two DMAs (a big item is cut anyway).
      if (offset == 0 && n - offset > room && n <= geometry.chunk_bytes && b.used > 0) {
        b.open_chunk();
        continue;
      }
      const size_t take = std::min(room, n - offset);
      b.add_fragment(item, offset, take);
      offset += take;
    }
  }
  return std::move(b.plan);
}

size_t piece_bytes_for(size_t total_bytes, size_t chunk_bytes, int threads) {
  const size_t per_chunk = std::min(total_bytes, chunk_bytes);
  const size_t want = per_chunk / (2 * static_cast<size_t>(std::max(1, threads)));
  const size_t piece = align_up(std::clamp<size_t>(want, 16u << 10, 256u << 10), 4096);
  return std::min(piece, chunk_bytes);
}

}  // namespace ferry
