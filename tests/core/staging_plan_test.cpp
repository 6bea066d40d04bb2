// staging_plan_test.cpp — items through a staging area: every byte of every
// item is in exactly one piece and one DMA, DMAs stay inside their chunk's
// slot, fragments start aligned, small items share chunks, big ones are cut.
// Table-driven plus random item lists; no memory behind the numbers.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "copy/staging_plan.h"

namespace ferry {
namespace {

constexpr size_t KiB = 1u << 10, MiB = 1u << 20;

// Checks every invariant of a plan; returns the number of chunks.
size_t check_plan(const std::vector<size_t>& items, const StagingGeometry& g) {
  StagingPlan p = plan_staging(items, g);
  std::vector<size_t> dma_cover(items.size(), 0), piece_cover(items.size(), 0);
  uint32_t next_piece = 0, next_dma = 0;
  for (size_t k = 0; k < p.chunks.size(); ++k) {
    const PlanChunk& c = p.chunks[k];
    EXPECT_EQ(c.slot, k % g.slots);
    EXPECT_EQ(c.first_piece, next_piece);
    EXPECT_EQ(c.first_dma, next_dma);
    EXPECT_GT(c.dmas, 0u) << "chunk " << k << " is empty";
    next_piece += c.pieces;
    next_dma += c.dmas;
    const size_t slot_begin = c.slot * g.chunk_bytes, slot_end = slot_begin + g.chunk_bytes;
    for (uint32_t d = c.first_dma; d < c.first_dma + c.dmas; ++d) {
      const PlanDma& dma = p.dmas[d];
      EXPECT_GE(dma.area_offset, slot_begin);
      EXPECT_LE(dma.area_offset + dma.bytes, slot_end);
      EXPECT_EQ(dma.area_offset % kFragmentAlign, 0u);
      EXPECT_EQ(dma.item_offset, dma_cover[dma.item]) << "DMAs of an item are in order and contiguous";
      dma_cover[dma.item] += dma.bytes;
    }
    for (uint32_t i = c.first_piece; i < c.first_piece + c.pieces; ++i) {
      const PlanPiece& piece = p.pieces[i];
      EXPECT_EQ(piece.chunk, k);
      EXPECT_GT(piece.bytes, 0u);
      EXPECT_LE(piece.bytes, g.piece_bytes);
      EXPECT_GE(piece.area_offset, slot_begin);
      EXPECT_LE(piece.area_offset + piece.bytes, slot_end);
      EXPECT_EQ(piece.item_offset, piece_cover[piece.item]);
      piece_cover[piece.item] += piece.bytes;
    }
    // No two fragments of a chunk overlap in the area.
    std::map<size_t, size_t> spans;
    for (uint32_t d = c.first_dma; d < c.first_dma + c.dmas; ++d) spans[p.dmas[d].area_offset] = p.dmas[d].bytes;
    size_t end = 0;
    for (auto [at, n] : spans) {
      EXPECT_GE(at, end);
      end = at + n;
    }
  }
  EXPECT_EQ(next_piece, p.pieces.size());
  EXPECT_EQ(next_dma, p.dmas.size());
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(dma_cover[i], items[i]) << "item " << i;
    EXPECT_EQ(piece_cover[i], items[i]) << "item " << i;
  }
  return p.chunks.size();
}

TEST(StagingPlan, CoversEveryItemExactlyOnce) {
  const StagingGeometry g{2 * MiB, 16, 256 * KiB};
  struct Case {
    const char* name;
    std::vector<size_t> items;
    size_t chunks;
  };
  const Case cases[] = {
      {"one byte", {1}, 1},
      {"one chunk exactly", {2 * MiB}, 1},
      {"one chunk and a byte", {2 * MiB + 1}, 2},
      {"bigger than the area: slots are reused", {100 * MiB + 7}, 51},
      {"small items share a chunk", {8 * KiB, 8 * KiB, 100, 3}, 1},
      {"a small item that does not fit starts a chunk", {2 * MiB - 4 * KiB, 8 * KiB}, 2},
      {"empty items get nothing", {0, 5, 0}, 1},
      {"nothing at all", {}, 0},
      {"odd sizes: the big one is cut across three chunks", {4095, 4097, 1 * MiB + 3, 3 * MiB - 1}, 3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(check_plan(c.items, g), c.chunks);
  }
}

TEST(StagingPlan, RandomItemListsKeepEveryInvariant) {
  std::mt19937_64 rng(20261122);
  for (int round = 0; round < 300; ++round) {
    StagingGeometry g;
    g.chunk_bytes = (1 + rng() % 8) * 64 * KiB;
    g.slots = 1 + rng() % 8;
    g.piece_bytes = 4 * KiB * (1 + rng() % 32);
    std::vector<size_t> items(rng() % 40);
    for (auto& n : items) n = rng() % 4 == 0 ? rng() % (3 * g.chunk_bytes) : rng() % 5000;
    SCOPED_TRACE(round);
    check_plan(items, g);
  }
}

TEST(StagingPlan, PiecesAreSizedToTheCopy) {
  EXPECT_EQ(piece_bytes_for(4 * KiB, 2 * MiB, 16), 16 * KiB);    // at least 16 KiB
  EXPECT_EQ(piece_bytes_for(1 * MiB, 2 * MiB, 16), 32 * KiB);    // two per thread
  EXPECT_EQ(piece_bytes_for(1u << 30, 2 * MiB, 16), 64 * KiB);   // per chunk, not per copy
  EXPECT_EQ(piece_bytes_for(1u << 30, 2 * MiB, 1), 256 * KiB);   // at most 256 KiB
  EXPECT_EQ(piece_bytes_for(1 * MiB, 16 * KiB, 4), 16 * KiB);    // never above the chunk
  EXPECT_EQ(piece_bytes_for(300 * KiB, 2 * MiB, 3) % (4 * KiB), 0u);
}

}  // namespace
}  // namespace ferry
