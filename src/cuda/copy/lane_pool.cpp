// lane_pool.cpp — lanes of the stream-ordered pipeline (lane_pool.h).
#include "cuda/copy/lane_pool.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "cuda/cuda_check.h"
#include "pool/pool.h"

namespace ferry::cuda {

std::unique_ptr<Lane> LanePool::make(Direction d) {
  auto l = std::make_unique<Lane>();
  l->dir = d;
  const int n = std::max(2, profile_.staging_slots);
  l->slot_bytes = profile_.staging_chunk_bytes;
  try {
    for (int i = 0; i < n; ++i)
      l->slots.push_back(static_cast<unsigned char*>(staging_.allocate(l->slot_bytes, 4096, HugeWant::yes)));
    check(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaHostAlloc(&l->flag_block, 2 * n * sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc (copy engine flags)");
  } catch (...) {  // leave nothing behind; the next call tries again
    for (auto* p : l->slots) staging_.deallocate(p);
    if (l->stream) cudaStreamDestroy(l->stream);
    throw;
  }
  std::memset(l->flag_block, 0, 2 * n * sizeof(uint64_t));
  l->cpu_flags = static_cast<volatile uint64_t*>(l->flag_block);
  l->gpu_flags = l->cpu_flags + n;
  return l;
}

Lane& LanePool::acquire(Direction d) {
  return lent_[static_cast<int>(d)].acquire([&] { return make(d); });
}

void LanePool::release(Lane& lane) noexcept { lent_[static_cast<int>(lane.dir)].release(lane); }

LanePool::~LanePool() {
  for (auto& lent : lent_)
    for (auto& l : lent.all_unlocked()) {
      cudaStreamSynchronize(l->stream);
      cudaStreamDestroy(l->stream);
      cudaFreeHost(l->flag_block);
      for (auto* slot : l->slots) staging_.deallocate(slot);
    }
  cudaGetLastError();
}

}  // namespace ferry::cuda
