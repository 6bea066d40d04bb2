// copy_args.h — what ferry's copy calls accept from Python, turned into
// addresses in C++ (a call's Python-side cost stays well under a microsecond):
//   int                         an address; its size comes from nbytes
//   torch.Tensor                data_ptr(), numel() * element_size(); must be contiguous
//   __cuda_array_interface__    CuPy, Numba; must be C-contiguous
//   the buffer protocol         bytes, bytearray, numpy, memoryview, ferry.Buffer
// and lists of addresses as Python lists or 1-d int64/uint64 arrays (numpy,
// torch CPU tensors).
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

typedef struct CUstream_st* cudaStream_t;

namespace ferry::python {

struct CopyArg {
  uintptr_t address = 0;
  size_t bytes = 0;       // 0 for an int (unknown)
  int cuda_device = -1;   // a torch CUDA tensor's device; -1 otherwise
  bool torch = false;     // a torch tensor (its stream is torch's current one)
  bool sized = false;     // bytes is known
};

// Throws InvalidArgument naming `role` ("dst", "src", "dsts[3]").
CopyArg resolve_copy_arg(nanobind::handle obj, bool writable, const char* role);

// A list, tuple or 1-d integer array of addresses; InvalidArgument otherwise.
std::vector<uintptr_t> addresses(nanobind::handle obj, const char* role);

// Block ids: a list or tuple of ints, or a 1-d int32/int64 array (numpy, torch
// CPU tensors); negative ids are refused later (copy/block_table.h).
std::vector<int64_t> block_ids(nanobind::handle obj, const char* role);

// None -> torch's current stream on `device` when a torch CUDA tensor is
// involved (torch_device >= 0; asked through torch_adapter.h), else 0 (the
// legacy default stream); an int;
// or anything with a `cuda_stream` attribute (torch.cuda.Stream).
cudaStream_t stream_of(nanobind::handle stream, int torch_device);

}  // namespace ferry::python
