// block_copy.cu — the SM block-copy kernel (see block_copy.h).
#include "cuda/copy/block_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.h"

namespace ferry::cuda {
namespace {

constexpr int kThreads = 1024;  // per thread block: one block per SM, 32 warps
constexpr int kUnroll = 8;      // vectors in flight per lane: 4 KiB per warp of 16-byte vectors

// `v` vectors of type V from s to d by the 32 lanes of a warp, kUnroll loads
// issued before their stores so that a PCIe read's latency is paid once per
// 32 * kUnroll vectors, not once per vector.
template <class V>
__device__ __forceinline__ void warp_copy_vectors(V* __restrict__ d, const V* __restrict__ s, size_t v, int lane) {
  size_t i = lane;
  for (; i + (kUnroll - 1) * 32 < v; i += kUnroll * 32) {
    V r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = s[i + u * 32];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * 32] = r[u];
  }
  if (i >= v) return;
  V r[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (i + u * 32 < v) r[u] = s[i + u * 32];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (i + u * 32 < v) d[i + u * 32] = r[u];
}

// Head bytes up to V's alignment, the body as V vectors, the tail bytes.
// Preconditions: d and s have the same address modulo sizeof(V).
template <class V>
__device__ __forceinline__ void warp_copy_aligned(unsigned char* d, const unsigned char* s, size_t n, int lane) {
  constexpr size_t w = sizeof(V);
  size_t head = (w - (reinterpret_cast<uintptr_t>(d) & (w - 1))) & (w - 1);
  if (head > n) head = n;
  if (static_cast<size_t>(lane) < head) d[lane] = s[lane];
  d += head, s += head, n -= head;
  const size_t v = n / w;
  warp_copy_vectors(reinterpret_cast<V*>(d), reinterpret_cast<const V*>(s), v, lane);
  const size_t tail = n - v * w;
  if (static_cast<size_t>(lane) < tail) d[v * w + lane] = s[v * w + lane];
}

// The widest vector that both ends' alignment allows (KV blocks: 16 bytes).
__device__ __forceinline__ void warp_copy(unsigned char* d, const unsigned char* s, size_t n, int lane) {
  const uintptr_t skew = reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(s);
  if ((skew & 15) == 0)
    warp_copy_aligned<uint4>(d, s, n, lane);
  else if ((skew & 7) == 0)
    warp_copy_aligned<uint2>(d, s, n, lane);
  else if ((skew & 3) == 0)
    warp_copy_aligned<unsigned int>(d, s, n, lane);
  else
    warp_copy_vectors(d, s, n, lane);
}

// Each warp takes `group` consecutive ops at a time (lane k reads op k of the
// group: one round trip for the group's descriptors), then copies them one
// after the other, every lane on each.
__global__ void __launch_bounds__(kThreads) copy_blocks_kernel(const BlockCopy* __restrict__ ops, size_t count,
                                                               int group) {
  const int lane = threadIdx.x & 31;
  const size_t warp = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const size_t warps = (static_cast<size_t>(gridDim.x) * blockDim.x) >> 5;
  for (size_t first = warp * group; first < count; first += warps * group) {
    unsigned long long d = 0, s = 0, n = 0;
    if (lane < group && first + lane < count) {
      const BlockCopy op = ops[first + lane];
      d = reinterpret_cast<uintptr_t>(op.dst), s = reinterpret_cast<uintptr_t>(op.src), n = op.bytes;
    }
    const int here = static_cast<int>(count - first < static_cast<size_t>(group) ? count - first : group);
    for (int k = 0; k < here; ++k) {
      const auto dk = __shfl_sync(0xffffffffu, d, k), sk = __shfl_sync(0xffffffffu, s, k),
                 nk = __shfl_sync(0xffffffffu, n, k);
      warp_copy(reinterpret_cast<unsigned char*>(dk), reinterpret_cast<const unsigned char*>(sk), nk, lane);
    }
  }
}

}  // namespace

namespace {

void launch_once(const BlockCopy* ops, size_t count, size_t sms, cudaStream_t stream) {
  // Ops per warp group: 32 when there are many (one descriptor per lane),
  // fewer when a batch is short, so that every warp of the grid gets some.
  const size_t warps = sms * (kThreads / 32);
  const int group = static_cast<int>(std::clamp<size_t>(count / warps, 1, 32));
  const size_t blocks = std::min(sms, (count + group * size_t{kThreads / 32} - 1) / (group * size_t{kThreads / 32}));
  copy_blocks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(ops, count, group);
  check(cudaGetLastError(), "copy_blocks_kernel launch");
}

}  // namespace

void launch_block_copies(const BlockCopy* ops, size_t count, size_t total_bytes, cudaStream_t stream, int max_sms,
                         size_t launch_bytes_per_sm) {
  if (count == 0) return;
  const size_t sms = max_sms > 0 ? static_cast<size_t>(max_sms) : kDefaultBlockCopySms;
  const size_t per_launch = launch_bytes_per_sm * sms;
  const size_t launches =
      per_launch == 0 ? 1 : std::clamp<size_t>((total_bytes + per_launch - 1) / per_launch, 1, count);
  // Launch k takes ops [count * k / launches, count * (k + 1) / launches): equal shares, none empty.
  for (size_t k = 0; k < launches; ++k) {
    const size_t first = count * k / launches, end = count * (k + 1) / launches;
    launch_once(ops + first, end - first, sms, stream);
  }
}

}  // namespace ferry::cuda
