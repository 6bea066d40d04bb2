// lender.h — objects made on demand, at most `max` of them, each lent to one
// borrower at a time and given back: the shape of the copy engine's staging
// areas (cuda/copy/area_pool.h) and lanes (cuda/copy/lane_pool.h).
//
// acquire: the most recently returned free object that `preferred` accepts;
// else a new one while fewer than `max` exist; else the longest-free object;
// else waits until one is given back.
//
// Locking: mu_ guards free_, all_ and count_, and whatever release's `update`
// writes. make() runs outside it (count_ reserves the object meanwhile), so it
// may make CUDA calls; a make() that throws gives its reservation back.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

namespace ferry {

template <class T>
class Lender {
 public:
  explicit Lender(int max) : max_(std::max(1, max)) {}
  Lender(const Lender&) = delete;
  Lender& operator=(const Lender&) = delete;

  // make: () -> std::unique_ptr<T>; preferred: (const T&) -> bool, under mu_.
  template <class Make, class Preferred>
  T& acquire(Make make, Preferred preferred) {
    std::unique_lock lock(mu_);
    for (;;) {
      auto idle = std::find_if(free_.rbegin(), free_.rend(), [&](T* t) { return preferred(*t); });
      if (idle != free_.rend()) {
        T* t = *idle;
        free_.erase(std::next(idle).base());
        return *t;
      }
      if (count_ < max_) {
        ++count_;
        lock.unlock();
        std::unique_ptr<T> made;
        try {
          made = make();
        } catch (...) {
          lock.lock();
          --count_;
          throw;
        }
        lock.lock();
        all_.push_back(std::move(made));
        return *all_.back();
      }
      if (!free_.empty()) {
        T* t = free_.front();
        free_.erase(free_.begin());
        return *t;
      }
      returned_.wait(lock);
    }
  }
  template <class Make>
  T& acquire(Make make) {
    return acquire(make, [](const T&) { return true; });
  }

  // update: (T&) -> void, noexcept, run under mu_ before t is free again.
  template <class Update>
  void release(T& t, Update update) noexcept {
    {
      std::lock_guard lock(mu_);
      update(t);
      free_.push_back(&t);
    }
    returned_.notify_one();
  }
  void release(T& t) noexcept {
    release(t, [](T&) {});
  }

  // Every object made. Preconditions: nothing is lent, no acquire runs (the
  // owner's destructor).
  const std::vector<std::unique_ptr<T>>& all_unlocked() const { return all_; }

 private:
  const int max_;
  std::mutex mu_;
  std::condition_variable returned_;
  std::vector<T*> free_;                 // mu_
  std::vector<std::unique_ptr<T>> all_;  // mu_ (grows only)
  int count_ = 0;                        // mu_: made or being made
};

}  // namespace ferry
