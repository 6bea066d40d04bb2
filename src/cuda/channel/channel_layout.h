// channel_layout.h — the memory the channel's host side (channel.cpp) and its
// GPU kernel (channel_kernel.cu) share, the request packing both sides use, and
// the kernel's launch entry point. Plain types and constexpr functions only, no
// CUDA header: compiled by the host compiler and by nvcc, and unit-tested
// without a GPU (tests/capi/channel_test.cpp).
//
// Mapped pinned host memory holds one Control block followed by the ring of
// Slots. Every 64-bit word has exactly one writer side (host or GPU) and is
// accessed with single-copy-atomic 8-byte loads and stores: the GPU has
// hostNativeAtomicSupported=0, so no read-modify-write ever crosses the bus.
//
// Request words ("LL" words, as in NCCL's low-latency protocol) are
// {tag = low 32 bits of the ticket, data32}: a word whose tag matches the
// ticket the kernel expects is valid on its own, so the kernel reads the whole
// request (header and up to kInlineBytes of write data) with one round of
// parallel loads, in any order, without waiting for a flag first.
// Invariant: the host writes all kRequestWords words of a slot for every
// request, so every word of a slot carries the tag of the last ticket that
// used it (initially ticket slot - slot_count) and a stale word never matches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_CHANNEL_HD __host__ __device__
#else
#define FERRY_CHANNEL_HD
#endif

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace ferry::cuda::channel_layout {

constexpr size_t kMaxPayload = 64 * 1024;  // bytes per request (ferry.h: FERRY_CHANNEL_MAX_PAYLOAD)

constexpr uint32_t kRequestWords = 32;  // one per lane of the kernel's polling warp
constexpr uint32_t kHeaderWords = 6;
constexpr uint32_t kInlineWords = kRequestWords - kHeaderWords;
constexpr uint32_t kInlineBytes = kInlineWords * 4;  // writes up to this size travel in the words

// Request word indices. kWordOp is the host's last store of a request: the
// kernel's stop-time re-check (channel.h, "Idle exit") reads only this word.
enum Word : uint32_t {
  kWordOp = 0,
  kWordBytes = 1,
  kWordAddressLow = 2,
  kWordAddressHigh = 3,
  kWordValue = 4,      // fill byte, signal value, wait value
  kWordTimeoutUs = 5,  // wait timeout
  // kHeaderWords .. kRequestWords-1: inline write data, byte i of the write at
  // byte i of the data halves taken in order (little-endian words).
};

enum Op : uint32_t {
  kOpNop = 1,  // ping
  kOpWrite = 2,
  kOpRead = 3,
  kOpFill = 4,
  kOpSignal = 5,
  kOpWait = 6,
};

enum Result : uint32_t {
  kResultOk = 0,
  kResultTimedOut = 1,    // wait: the flag did not reach the value in time
  kResultBadRequest = 2,  // the kernel refused the request (a bug: the host validates)
  kResultStopped = 3,     // wait: aborted because the channel is closing
};

// Control::kernel_state = generation << 2 | phase.
enum Phase : uint64_t {
  kPhaseRunning = 1,
  kPhaseStopping = 2,
  kPhaseStopped = 3,
};

FERRY_CHANNEL_HD constexpr uint64_t make_word(uint64_t ticket, uint32_t data) {
  return (ticket << 32) | data;  // the tag keeps the ticket's low 32 bits
}
FERRY_CHANNEL_HD constexpr uint32_t word_tag(uint64_t word) { return static_cast<uint32_t>(word >> 32); }
FERRY_CHANNEL_HD constexpr uint32_t ticket_tag(uint64_t ticket) { return static_cast<uint32_t>(ticket); }
FERRY_CHANNEL_HD constexpr uint32_t word_data(uint64_t word) { return static_cast<uint32_t>(word); }
FERRY_CHANNEL_HD constexpr uint64_t make_state(uint64_t generation, Phase phase) { return (generation << 2) | phase; }
FERRY_CHANNEL_HD constexpr uint64_t state_generation(uint64_t state) { return state >> 2; }
FERRY_CHANNEL_HD constexpr uint64_t state_phase(uint64_t state) { return state & 3; }

// The data halves of a request's kRequestWords words (publish adds the tags).
struct RequestData {
  uint32_t word[kRequestWords];
};
static_assert(sizeof(RequestData) == kRequestWords * 4);

// Whether a request's data travels inline in the request words (else: in the
// slot's payload area, or there is none).
FERRY_CHANNEL_HD constexpr bool has_inline_payload(uint32_t op, uint32_t bytes) {
  return op == kOpWrite && bytes <= kInlineBytes;
}
// Where a request's data sits in the slot's payload area: at the device
// address's offset in its 16-byte line, so that both sides are co-aligned.
FERRY_CHANNEL_HD constexpr uint32_t payload_offset(uint64_t device_address) {
  return static_cast<uint32_t>(device_address & 15u);
}
FERRY_CHANNEL_HD constexpr uint64_t request_address(const uint32_t* word) {
  return (static_cast<uint64_t>(word[kWordAddressHigh]) << 32) | word[kWordAddressLow];
}
FERRY_CHANNEL_HD inline const unsigned char* inline_payload(const uint32_t* word) {
  return reinterpret_cast<const unsigned char*>(word + kHeaderWords);
}

// Host: the request data. write_src is read only for inline writes
// (has_inline_payload); the inline words past the data are zero.
inline RequestData pack_request(Op op, uint64_t device_address, uint32_t bytes, uint32_t value,
                                uint32_t timeout_us, const void* write_src) {
  RequestData d{};
  d.word[kWordOp] = op;
  d.word[kWordBytes] = bytes;
  d.word[kWordAddressLow] = static_cast<uint32_t>(device_address);
  d.word[kWordAddressHigh] = static_cast<uint32_t>(device_address >> 32);
  d.word[kWordValue] = value;
  d.word[kWordTimeoutUs] = timeout_us;
  if (has_inline_payload(op, bytes)) std::memcpy(&d.word[kHeaderWords], write_src, bytes);
  return d;
}

// How the kernel's block moves n bytes to dst (a copy's or a fill's
// destination): bytes [0, head) one by one up to dst's first 16-byte boundary
// (all n bytes when the range ends before it), then `vectors` aligned 16-byte
// vectors, then bytes [tail, n) one by one (fewer than 16).
struct Edges {
  uint32_t head, vectors, tail;
};
FERRY_CHANNEL_HD constexpr Edges split_edges(uint64_t dst, uint32_t n) {
  uint32_t head = static_cast<uint32_t>((16u - (dst & 15u)) & 15u);
  if (head > n) head = n;
  const uint32_t vectors = (n - head) / 16;
  return Edges{head, vectors, head + vectors * 16};
}

struct alignas(256) Slot {
  uint64_t request[kRequestWords];  // host -> GPU: LL words
  uint64_t done;                    // GPU -> host: make_word(ticket, Result), release-stored
  uint64_t done_padding[31];
  // Write source / read destination, at payload_offset(device address).
  unsigned char payload[kMaxPayload + 256];
};
static_assert(sizeof(Slot) % 256 == 0);
static_assert(offsetof(Slot, payload) % 16 == 0, "payload_offset co-alignment needs 16-byte lines");

struct alignas(256) Control {
  uint64_t kernel_state;  // GPU -> host: make_state(generation, phase)
  uint64_t idle_exits;    // GPU -> host: kernels that left because they were idle
  uint64_t gpu_padding[30];
  uint64_t stop;  // host -> GPU: nonzero asks the kernel to leave now (close)
  uint64_t host_padding[31];
};
static_assert(sizeof(Control) == 512);

// In device memory; read and written only by the kernel. Kernels run one after
// the other on the channel's stream, so each sees its predecessor's values.
struct KernelState {
  uint64_t next_ticket;
  uint64_t idle_exits;
};

struct KernelParams {
  Control* control;      // device view of the mapped block
  Slot* slots;           // device view of the ring
  KernelState* state;    // device memory
  uint32_t slot_count;
  uint64_t generation;   // the kernel publishes its phases under this number
  uint64_t idle_ns;      // leave after this long without a request
};

// Launches the channel kernel (one block) on `stream` (a cudaStream_t);
// returns the launch's cudaError_t.
int launch_kernel(const KernelParams& params, CUstream_st* stream);

}  // namespace ferry::cuda::channel_layout
