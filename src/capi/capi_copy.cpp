// capi_copy.cpp — C API over the copy engine and explicit registrations.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "capi/guard.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/registration.h"

using ferry::capi::guarded;
using ferry::capi::live;
using ferry::capi::require;

struct ferry_engine : ferry::capi::HandleOf<ferry::capi::kEngineMagic> {
  std::unique_ptr<ferry::cuda::CopyEngine> engine;
};
struct ferry_copy_state : ferry::capi::HandleOf<ferry::capi::kCopyMagic> {
  ferry::cuda::Completion completion;
};
struct ferry_registration : ferry::capi::HandleOf<ferry::capi::kRegistrationMagic> {
  std::unique_ptr<ferry::cuda::Registration> registration;
};

namespace {

ferry::Strategy to_cpp(ferry_strategy_t s) {
  switch (s) {
    case FERRY_STRATEGY_AUTO: return ferry::Strategy::automatic;
    case FERRY_STRATEGY_DIRECT: return ferry::Strategy::direct;
    case FERRY_STRATEGY_STAGED: return ferry::Strategy::staged;
    case FERRY_STRATEGY_PIN_IN_PLACE: return ferry::Strategy::pin_in_place;
    case FERRY_STRATEGY_HYBRID: return ferry::Strategy::hybrid;
    case FERRY_STRATEGY_CUDA: return ferry::Strategy::cuda;
    case FERRY_STRATEGY_SM: return ferry::Strategy::sm;
  }
  throw ferry::InvalidArgument("strategy=" + std::to_string(static_cast<int>(s)) +
                               ": expected a ferry_strategy_t value");
}

std::vector<ferry::cuda::CopyOp> items_of(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                          size_t count) {
  require(dsts, "dsts");
  require(srcs, "srcs");
  require(sizes, "sizes");
  std::vector<ferry::cuda::CopyOp> ops(count);
  for (size_t i = 0; i < count; ++i) ops[i] = {dsts[i], srcs[i], sizes[i]};
  return ops;
}

}  // namespace

extern "C" {

ferry_status_t ferry_engine_create(int device, ferry_engine_t* out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    auto h = std::make_unique<ferry_engine>();
    h->engine = std::make_unique<ferry::cuda::CopyEngine>(ferry::cuda::CopyEngineOptions::from_environment(device));
    *out = h.release();
  });
}

ferry_status_t ferry_engine_destroy(ferry_engine_t engine) {
  return guarded([&] { ferry::capi::destroy(engine, "engine", [](ferry_engine& h) { h.engine.reset(); }); });
}

ferry_status_t ferry_copy_v2(ferry_engine_t engine, void* dst, const void* src, size_t bytes, void* stream,
                             ferry_strategy_t strategy) {
  return guarded([&] {
    live(engine, "engine");
    engine->engine->copy(dst, src, bytes, static_cast<cudaStream_t>(stream), to_cpp(strategy));
  });
}

ferry_status_t ferry_copy(ferry_engine_t engine, void* dst, const void* src, size_t bytes) {
  return ferry_copy_v2(engine, dst, src, bytes, nullptr, FERRY_STRATEGY_AUTO);
}

ferry_status_t ferry_copy_async(ferry_engine_t engine, void* dst, const void* src, size_t bytes, void* stream,
                                ferry_strategy_t strategy, ferry_copy_t* out) {
  return guarded([&] {
    live(engine, "engine");
    require(out, "out");
    *out = nullptr;
    auto h = std::make_unique<ferry_copy_state>();
    h->completion =
        engine->engine->copy_async(dst, src, bytes, static_cast<cudaStream_t>(stream), to_cpp(strategy));
    *out = h.release();
  });
}

ferry_status_t ferry_copy_batch_async(ferry_engine_t engine, void* const* dsts, const void* const* srcs,
                                      const size_t* sizes, size_t count, void* stream, ferry_copy_t* out) {
  return ferry_copy_many_async(engine, dsts, srcs, sizes, count, stream, FERRY_STRATEGY_AUTO, out);
}

ferry_status_t ferry_copy_many_async(ferry_engine_t engine, void* const* dsts, const void* const* srcs,
                                     const size_t* sizes, size_t count, void* stream, ferry_strategy_t strategy,
                                     ferry_copy_t* out) {
  return guarded([&] {
    live(engine, "engine");
    require(out, "out");
    *out = nullptr;
    auto ops = items_of(dsts, srcs, sizes, count);
    auto h = std::make_unique<ferry_copy_state>();
    h->completion = engine->engine->copy_many_async(ops, static_cast<cudaStream_t>(stream), to_cpp(strategy));
    *out = h.release();
  });
}

ferry_status_t ferry_copy_many_v2(ferry_engine_t engine, void* const* dsts, const void* const* srcs,
                                  const size_t* sizes, size_t count, void* stream, ferry_strategy_t strategy) {
  return guarded([&] {
    live(engine, "engine");
    engine->engine->copy_many(items_of(dsts, srcs, sizes, count), static_cast<cudaStream_t>(stream),
                              to_cpp(strategy));
  });
}

ferry_status_t ferry_copy_many(ferry_engine_t engine, void* const* dsts, const void* const* srcs,
                               const size_t* sizes, size_t count, void* stream) {
  return ferry_copy_many_v2(engine, dsts, srcs, sizes, count, stream, FERRY_STRATEGY_AUTO);
}

ferry_status_t ferry_copy_wait(ferry_copy_t copy) {
  return guarded([&] {
    live(copy, "copy");
    copy->completion.wait();
  });
}

ferry_status_t ferry_copy_query(ferry_copy_t copy, int* done) {
  return guarded([&] {
    live(copy, "copy");
    require(done, "done");
    *done = copy->completion.query() ? 1 : 0;
  });
}

ferry_status_t ferry_copy_get_event(ferry_copy_t copy, void** event) {
  return guarded([&] {
    live(copy, "copy");
    require(event, "event");
    *event = copy->completion.event();
  });
}

ferry_status_t ferry_copy_get_strategy(ferry_copy_t copy, ferry_strategy_t* strategy) {
  return guarded([&] {
    live(copy, "copy");
    require(strategy, "strategy");
    *strategy = static_cast<ferry_strategy_t>(static_cast<int>(copy->completion.strategy()));
  });
}

ferry_status_t ferry_copy_destroy(ferry_copy_t copy) {
  return guarded([&] {
    ferry::capi::destroy(copy, "copy", [](ferry_copy_state& h) {
      try {
        h.completion.wait();  // never free state the engine still uses
      } catch (const ferry::Error&) {
        // its error was (or can no longer be) reported through ferry_copy_wait
      }
      h.completion = ferry::cuda::Completion();
    });
  });
}

ferry_status_t ferry_copy_release(ferry_copy_t copy) { return ferry_copy_destroy(copy); }

ferry_status_t ferry_registration_create(void* ptr, size_t bytes, int device, ferry_registration_t* out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    auto h = std::make_unique<ferry_registration>();
    h->registration = std::make_unique<ferry::cuda::Registration>(ptr, bytes, device);
    *out = h.release();
  });
}

ferry_status_t ferry_registration_destroy(ferry_registration_t registration) {
  return guarded([&] {
    ferry::capi::destroy(registration, "registration",
                         [](ferry_registration& h) { h.registration.reset(); });
  });
}

ferry_status_t ferry_register(void* ptr, size_t bytes, int device, ferry_registration_t* out) {
  return ferry_registration_create(ptr, bytes, device, out);
}

ferry_status_t ferry_unregister(ferry_registration_t registration) {
  return ferry_registration_destroy(registration);
}

}  // extern "C"
