// finishing_thread.cpp — see finishing_thread.h.
#include "core/finishing_thread.h"

#include <thread>

namespace ferry {

void FinishingThread::start(std::function<void()> work) {
  auto state = std::make_shared<State>();
  std::thread([state, work = std::move(work)] {
    work();  // noexcept in practice: the owner's work catches what it throws
    std::lock_guard lock(state->mu);
    state->done = true;
    state->cv.notify_all();
  }).detach();
  state_ = std::move(state);
}

void FinishingThread::wait() noexcept {
  if (!state_) return;
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
}

}  // namespace ferry
