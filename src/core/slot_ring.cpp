// slot_ring.cpp — the slot ring's states and order.
#include "core/slot_ring.h"

#include "core/error.h"

namespace ferry {

SlotRing::SlotRing(size_t slots) : state_(slots, SlotState::free) {
  if (slots == 0) throw InvalidArgument("a slot ring needs at least one slot");
  for (size_t s = 0; s < slots; ++s) order_.push_back(s);
}

SlotRing::Taken SlotRing::take() {
  std::unique_lock<std::mutex> lock(mu_);
  returned_.wait(lock, [&] { return stopped_ || !order_.empty(); });
  if (stopped_) return {};
  const size_t s = order_.front();
  order_.pop_front();
  const bool pending = state_[s] == SlotState::in_flight;
  state_[s] = SlotState::filling;
  return {s, pending};
}

void SlotRing::put_back(size_t slot, SlotState s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot >= state_.size() || state_[slot] != SlotState::filling)
      throw InvalidArgument("slot ring: slot " + std::to_string(slot) + " is not being filled (of " +
                            std::to_string(state_.size()) + ")");
    state_[slot] = s;
    order_.push_back(slot);
  }
  returned_.notify_one();
}

void SlotRing::hand_off(size_t slot) { put_back(slot, SlotState::in_flight); }
void SlotRing::give_back(size_t slot) { put_back(slot, SlotState::free); }

void SlotRing::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  returned_.notify_all();
}

SlotState SlotRing::state(size_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.at(slot);
}

}  // namespace ferry
