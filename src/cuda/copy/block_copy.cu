// block_copy.cu — the SM block-copy kernel (see block_copy.h).
#include "cuda/copy/block_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.h"

namespace ferry::cuda {
namespace {

// Ops travel by value in the kernel's parameters (no buffer to keep alive):
// 1024 ops of 24 bytes fit the 32 KiB parameter space of CUDA 12.1+.
constexpr int kOpsPerLaunch = 1024;

struct Ops {
  BlockCopy op[kOpsPerLaunch];
  int count;
};

__device__ void copy_bytes(unsigned char* d, const unsigned char* s, size_t n) {
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

// One thread block per op (grid-stride over ops). When source and destination
// share their alignment modulo 16, the body moves as 16-byte vectors, four in
// flight per thread; otherwise byte by byte (rare for KV blocks).
__global__ void __launch_bounds__(512) copy_blocks_kernel(const __grid_constant__ Ops ops) {
  for (int i = blockIdx.x; i < ops.count; i += gridDim.x) {
    auto* d = static_cast<unsigned char*>(ops.op[i].dst);
    const auto* s = static_cast<const unsigned char*>(ops.op[i].src);
    size_t n = ops.op[i].bytes;
    const uintptr_t da = reinterpret_cast<uintptr_t>(d), sa = reinterpret_cast<uintptr_t>(s);
    if ((da & 15) != (sa & 15)) {
      copy_bytes(d, s, n);
      continue;
    }
    size_t head = (16 - (da & 15)) & 15;
    if (head > n) head = n;
    copy_bytes(d, s, head);
    d += head;
    s += head;
    n -= head;
    const size_t vectors = n / 16;
    auto* dv = reinterpret_cast<uint4*>(d);
    const auto* sv = reinterpret_cast<const uint4*>(s);
    size_t v = threadIdx.x;
    const size_t stride = blockDim.x;
    for (; v + 3 * stride < vectors; v += 4 * stride) {
      uint4 a = sv[v], b = sv[v + stride], c = sv[v + 2 * stride], e = sv[v + 3 * stride];
      dv[v] = a;
      dv[v + stride] = b;
      dv[v + 2 * stride] = c;
      dv[v + 3 * stride] = e;
    }
    for (; v < vectors; v += stride) dv[v] = sv[v];
    copy_bytes(d + vectors * 16, s + vectors * 16, n - vectors * 16);
  }
}

}  // namespace

void launch_block_copies(const BlockCopy* copies, size_t count, cudaStream_t stream, int max_sms) {
  const int sms = max_sms > 0 ? max_sms : 16;
  for (size_t first = 0; first < count; first += kOpsPerLaunch) {
    Ops ops{};
    ops.count = static_cast<int>(std::min<size_t>(kOpsPerLaunch, count - first));
    std::copy_n(copies + first, ops.count, ops.op);
    copy_blocks_kernel<<<std::min(ops.count, sms), 512, 0, stream>>>(ops);
    check(cudaGetLastError(), "copy_blocks_kernel launch");
  }
}

}  // namespace ferry::cuda
