// copy_engine.cpp — the copy engine's dispatcher: creation, each call's route
// (copy/strategy.h's choose_route decides; this file only follows it), and
// the paths that are one CUDA call or a hand-off to another file:
// streamed_copy.cpp, pin_in_place.cpp, eager_copy.cpp, many_plan.cpp.
#include "cuda/copy/copy_engine.h"

#include <cuda_runtime_api.h>


#include "copy/plan.h"
#include "copy/profile_file.h"
#include "core/error.h"
#include "core/options.h"
#include "cuda/copy/block_copy.h"
#include "cuda/copy/engine_impl.h"
#include "cuda/copy/many_plan.h"
#include "cuda/copy/placement.h"
#include "cuda/copy/pointer_checks.h"
#include "cuda/cuda_check.h"
#include "cuda/driver_entry.h"
#include "cuda/pointer_lookup.h"
#include "cuda/scoped_device.h"
#include "pool/pool.h"

namespace ferry::cuda {

void CopyEngine::Impl::count(Strategy s, size_t bytes, size_t chunks, size_t pieces, size_t eager) {
  std::lock_guard lock(stats_mu);
  ++stats.copies;
  stats.bytes += bytes;
  ++stats.by_strategy[static_cast<int>(s)];
  stats.chunks += chunks;
  stats.pinned_pieces += pieces;
  stats.eager_runs += eager;
}

void CopyEngine::Impl::dma_and_wait(void* dst, const void* src, size_t n, cudaStream_t stream,
                                    PointerLookup& lookup) {
  PooledEvent done(events);
  split_at_registrations(dst, src, n, lookup, [&](void* d, const void* s, size_t k) {
    check(cudaMemcpyAsync(d, s, k, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  });
  check(cudaEventRecord(done.get(), stream), "cudaEventRecord");
  check(cudaEventSynchronize(done.get()), "cudaEventSynchronize (copy)");
}

void CopyEngine::Impl::run_eager_items(Direction dir, std::span<const EagerItem> items, cudaStream_t stream,
                                       bool wait) {
  PooledArea* area = areas->acquire();
  bool pending = true;  // on error, assume the area's slots may still be read
  try {
    pending = run_eager(dir, items, *area, *crew, stream, wait);
  } catch (...) {
    areas->release(area, true);
    throw;
  }
  areas->release(area, pending);
}

// ---- the engine -------------------------------------------------------------------

CopyEngineOptions CopyEngineOptions::from_environment(int device) {
  CopyEngineOptions o;
  o.device = device;
  const Options& env = ferry::options();
  o.strategy = parse_strategy(env.text("FERRY_COPY_STRATEGY"));
  o.workers = static_cast<int>(env.integer("FERRY_COPY_WORKERS"));
  o.profile = load_machine_profile();
  return o;
}

CopyEngine::CopyEngine(CopyEngineOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  const MachineProfile& p = m.options.profile;
  if (p.staging_chunk_bytes == 0 || p.staging_slots < 2)
    throw InvalidArgument("copy engine profile: staging_chunk_bytes must be > 0 and staging_slots >= 2");
  if (p.eager_chunk_bytes == 0 || p.eager_chunk_bytes % kFragmentAlign || p.eager_slots < 1 || p.eager_areas < 1)
    throw InvalidArgument("copy engine profile: eager_chunk_bytes must be a multiple of 256 and eager_slots, "
                          "eager_areas >= 1");
  ScopedDevice on(options.device);  // throws NoDevice / InvalidArgument
  if (!stream_memops_supported(options.device))
    throw NotSupported("device " + std::to_string(options.device) +
                       " does not support 64-bit stream memory operations, which the copy engine needs");
  EnginePlacement placed = place_engine(options.device);
  m.numa_node = placed.numa_node;
  m.crew = placed.crew;
  m.staging = std::move(placed.staging);
  m.lanes = std::make_unique<LanePool>(*m.staging, m.options.profile, options.device);
  StagingGeometry g;
  g.chunk_bytes = p.eager_chunk_bytes;
  g.slots = static_cast<uint32_t>(p.eager_slots);
  m.areas = std::make_unique<AreaPool>(*m.staging, g, p.eager_areas);
  m.pinner = std::make_unique<WorkerPool>(1);
}

CopyEngine::~CopyEngine() {
  if (impl_->forked()) {  // no join, no CUDA call in a forked child
    abandon_in_child(impl_);
    return;
  }
  Impl& m = *impl_;
  try {
    ScopedDevice on(m.options.device);
    m.pinner.reset();   // joins after the queued pin jobs
    for (auto& w : m.workers) w.reset();  // joins after the queued chunk tasks
    m.lanes.reset();    // synchronizes each lane's stream
    m.areas.reset();    // waits for each slot's last DMA
    for (cudaStream_t& s : m.side)
      if (s) cudaStreamSynchronize(s), cudaStreamDestroy(s), s = nullptr;
  } catch (...) {  // no device to switch to: nothing of ours can still run on it
  }
  cudaGetLastError();
}

void CopyEngine::warm_up() {
  impl_->refuse_if_forked();
  ScopedDevice on(impl_->options.device);
  impl_->areas->release(impl_->areas->acquire(), false);
}

// ---- one copy -----------------------------------------------------------------------

Route CopyEngine::Impl::route(void* dst, const void* src, size_t bytes, Strategy strategy, CallKind call,
                              PointerLookup& lookup) {
  refuse_if_forked();  // every copy call decides first
  const CopyPair pair = check_copy_pair(dst, src, bytes, lookup, options.device);
  return choose_route(copy_facts(pair, bytes, call), options.profile,
                      strategy != Strategy::automatic ? strategy : options.strategy);
}

Strategy CopyEngine::plan(void* dst, const void* src, size_t bytes, Strategy strategy) {
  PointerLookup lookup;
  return impl_->route(dst, src, bytes, strategy, CallKind::copy_async, lookup).strategy;
}

Completion CopyEngine::copy_async(void* dst, const void* src, size_t bytes, cudaStream_t stream,
                                  Strategy strategy) {
  PointerLookup lookup;
  const Route r = impl_->route(dst, src, bytes, strategy, CallKind::copy_async, lookup);  // validates first
  ScopedDevice on(impl_->options.device);
  return impl_->start(dst, src, bytes, stream, r, lookup);
}

Completion CopyEngine::Impl::start(void* dst, const void* src, size_t bytes, cudaStream_t stream, const Route& r,
                                   PointerLookup& lookup) {
  const Direction dir = r.dir;
  auto st = begin_copy(r.strategy, bytes);
  size_t chunks = 0, eager = 0;
  switch (r.path) {
    case Path::dma:
    case Path::cuda:
      split_at_registrations(dst, src, bytes, lookup, [&](void* d, const void* s, size_t k) {
        check(cudaMemcpyAsync(d, s, k, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
      });
      check(cudaEventRecord(st->done, stream), "cudaEventRecord");
      break;
    case Path::eager: {
      EagerItem item{dst, src, bytes};
      run_eager_items(dir, {&item, 1}, stream, /*wait=*/false);
      check(cudaEventRecord(st->done, stream), "cudaEventRecord");
      eager = 1;
      break;
    }
    case Path::streamed: {
      auto pieces = split_even(bytes, staged_chunk_bytes(bytes));
      chunks = pieces.size();
      run_streamed(st, dir, dst, src, pieces, stream);
      break;
    }
    case Path::pin_in_place:
      run_pin_in_place(st, dir, dst, src, bytes,
                       r.strategy == Strategy::hybrid ? options.profile.hybrid_pinned_share[static_cast<int>(dir)] : 1.0,
                       stream);
      break;
    case Path::sm_kernel: {
      std::vector<BlockCopy> ops;
      split_at_registrations(dst, src, bytes, lookup, [&](void* d, const void* s, size_t k) {
        ops.push_back({lookup.device_view(d), lookup.device_view(s), k});
      });
      launch_kernel(ops, stream);
      check(cudaEventRecord(st->done, stream), "cudaEventRecord");
      break;
    }
  }
  count(r.strategy, bytes, chunks, 0, eager);
  return Completion(st);
}

void CopyEngine::copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, Strategy strategy) {
  Impl& m = *impl_;
  PointerLookup lookup;
  const Route r = m.route(dst, src, bytes, strategy, CallKind::copy, lookup);
  ScopedDevice on(m.options.device);
  switch (r.path) {
    case Path::dma:
    case Path::cuda:
      m.dma_and_wait(dst, src, bytes, stream, lookup);
      m.count(r.strategy, bytes, 0, 0, 0);
      return;
    case Path::eager: {
      EagerItem item{dst, src, bytes};
      m.run_eager_items(r.dir, {&item, 1}, stream, /*wait=*/true);
      m.count(r.strategy, bytes, 0, 0, 1);
      return;
    }
    default:
      m.start(dst, src, bytes, stream, r, lookup).wait();  // counted there
      return;
  }
}

// ---- many items ---------------------------------------------------------------------

Completion CopyEngine::copy_many_async(std::span<const CopyOp> ops, cudaStream_t stream, Strategy strategy) {
  return impl_copy_many(ops, stream, strategy, /*wait=*/false);
}

void CopyEngine::copy_many(std::span<const CopyOp> ops, cudaStream_t stream, Strategy strategy) {
  impl_copy_many(ops, stream, strategy, /*wait=*/true).wait();
}

namespace {

// "No stream": the engine picks one (its stream for the call's direction).
// cudaStreamLegacy, the legacy default stream named, is a stream like any
// other: the copy runs on it, so later work there waits for the copy.
bool no_stream(cudaStream_t s) { return s == nullptr; }

// Streams cudaMemcpyBatchAsync refuses: one cudaMemcpyAsync per item there.
bool default_stream(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

}  // namespace

cudaStream_t CopyEngine::Impl::side_stream(Direction d) {
  std::call_once(side_made, [&] {
    for (cudaStream_t& s : side) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate (copy_many)");
  });
  return side[static_cast<int>(d)];
}

void CopyEngine::Impl::launch_kernel(std::span<const BlockCopy> ops, cudaStream_t stream) {
  launch_listed_copies(op_buffers, ops, stream, options.profile.batch_sm_max_sms,
                       options.profile.batch_sm_launch_bytes);
}

// With no stream, the call runs on the engine's stream for its direction
// (side_stream), which first waits for the work queued on the legacy default
// stream before the call (an event recorded there): a kernel that wrote the
// source on the legacy stream, or on a blocking stream that the legacy stream
// waits for, is ordered before the copy. Nothing queued later on any stream
// waits for the copy: copy_many returns once it is done; copy_many_async's
// Completion (wait(), or its event) is what later work waits on.
Completion CopyEngine::impl_copy_many(std::span<const CopyOp> ops, cudaStream_t stream, Strategy strategy,
                                      bool wait) {
  Impl& m = *impl_;
  m.refuse_if_forked();
  if (ops.empty()) throw InvalidArgument("copy_many: no items");
  // Check every item before anything is enqueued: by allocation range where
  // the batch is blocks of pinned and device memory, else one by one; one
  // lookup asks the driver once per allocation, not several times per item.
  // The device first: in a thread that never made a context current the
  // driver reports pinned memory without its device mapping, which
  // PointerLookup then cannot keep, and every item would ask the driver again
  // (1.2 us a block: two fresh Python threads copying 4 KiB blocks both ways
  // reached 6.5 GB/s on the H100 that way).
  ScopedDevice on(m.options.device);
  // ScopedDevice leaves the device alone when cudaGetDevice already names it,
  // which a fresh thread's answer (0) does without any context bound to the
  // thread; cudaSetDevice binds the primary context (CUDA 12+) for the driver's
  // pointer queries.
  check(cudaSetDevice(m.options.device), "cudaSetDevice");
  PointerLookup lookup;
  const Strategy requested = strategy != Strategy::automatic ? strategy : m.options.strategy;
  ManyPlan p = plan_many(ops, wait ? CallKind::copy_many : CallKind::copy_many_async, m.options.profile, requested,
                         lookup, m.options.device);
  if (no_stream(stream)) {
    const Direction d = p.directions[0] || !p.directions[1] ? Direction::h2d : Direction::d2h;
    cudaStream_t mine = m.side_stream(d);
    PooledEvent before(m.events);
    check(cudaEventRecord(before.get(), cudaStreamLegacy), "cudaEventRecord (legacy stream)");
    check(cudaStreamWaitEvent(mine, before.get(), 0), "cudaStreamWaitEvent");
    stream = mine;
  }
  auto st = begin_copy(p.main, p.total);
  if (!p.dsts.empty()) {
    if (default_stream(stream)) {  // the batch API refuses the default streams: one call each
      for (size_t i = 0; i < p.dsts.size(); ++i)
        check(cudaMemcpyAsync(p.dsts[i], p.srcs[i], p.sizes[i], cudaMemcpyDefault, stream), "cudaMemcpyAsync (batch)");
    } else {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_index = 0;
      check(cudaMemcpyBatchAsync(p.dsts.data(), const_cast<const void**>(p.srcs.data()), p.sizes.data(),
                                 p.dsts.size(), &attr, &attr_index, 1, stream),
            "cudaMemcpyBatchAsync");
    }
  }
  if (!p.kernel_ops.empty()) m.launch_kernel(p.kernel_ops, stream);
  // Host->device first: its DMAs queue behind the pinned ones while the CPU
  // stages; device->host (synchronous calls) after.
  size_t eager_runs = 0;
  for (int d : {0, 1}) {
    if (p.eager[d].empty()) continue;
    m.run_eager_items(static_cast<Direction>(d), p.eager[d], stream, wait);
    ++eager_runs;
  }
  std::vector<Completion> parts;
  try {
    for (const auto& [i, route] : p.single)
      parts.push_back(m.start(ops[i].dst, ops[i].src, ops[i].bytes, stream, route, lookup));
    // Streamed items recorded their own events, which the caller's stream
    // already waits on; the call's event follows them on that stream.
    check(cudaEventRecord(st->done, stream), "cudaEventRecord");
  } catch (...) {
    // Nothing of this call may touch the caller's buffers once it throws.
    for (auto& c : parts) {
      try {
        c.wait();
      } catch (...) {
      }
    }
    cudaStreamSynchronize(stream);
    cudaGetLastError();
    throw;
  }
  st->parts = std::move(parts);
  m.count(p.main, p.total, 0, 0, eager_runs);
  return Completion(st);
}

CopyEngineStats CopyEngine::stats() const {
  impl_->refuse_if_forked();
  std::lock_guard lock(impl_->stats_mu);
  return impl_->stats;
}

const CopyEngineOptions& CopyEngine::options() const { return impl_->options; }

int CopyEngine::numa_node() const { return impl_->numa_node; }

const Crew& CopyEngine::crew() const { return *impl_->crew; }

}  // namespace ferry::cuda
