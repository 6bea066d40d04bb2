// torch_adapter.h — the one place in the bindings that reaches PyTorch.
//
// PyTorch's private names live in python/ferry/torch/_torch_private.py alone,
// each with the PyTorch versions it was checked against
// (tests/python/test_torch_private.py runs them on the newest and the oldest
// supported PyTorch). What C++ needs of them it asks that file for once, here,
// and keeps: no import and no attribute lookup per call.
#pragma once

#include <cstdint>

namespace ferry::python {

// The handle of the calling thread's current PyTorch CUDA stream on `device`
// (0: the legacy default stream), without making a torch.cuda.Stream.
// Preconditions: the GIL is held; PyTorch is imported (a torch CUDA tensor was
// given). Errors raised by PyTorch propagate as nb::python_error.
uintptr_t torch_current_stream(int device);

}  // namespace ferry::python
