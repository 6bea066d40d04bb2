// string_list.h — many strings in one buffer: 8 bytes each beside their text,
// where a std::string takes 32 (and a heap block of its own past 15 bytes).
// A hostile header or shard index can name millions of short strings
// ("a":"", costs 6 bytes of text); packed, they stay within a small multiple
// of the text they came from.
#pragma once

#include <cstddef>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::load {

class StringList {
 public:
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = std::string_view;
    using difference_type = std::ptrdiff_t;
    using reference = std::string_view;  // made on the fly: a view into the list
    using pointer = void;
    Iterator() = default;
    Iterator(const StringList* list, size_t i) : list_(list), i_(i) {}
    std::string_view operator*() const { return (*list_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator was = *this;
      ++i_;
      return was;
    }
    bool operator==(const Iterator&) const = default;

   private:
    const StringList* list_ = nullptr;
    size_t i_ = 0;
  };

  void reserve(size_t strings) { ends_.reserve(strings); }
  void push_back(std::string_view s) {
    text_.append(s);
    ends_.push_back(text_.size());
  }
  size_t size() const noexcept { return ends_.size(); }
  bool empty() const noexcept { return ends_.empty(); }
  std::string_view operator[](size_t i) const noexcept {
    const size_t begin = i ? ends_[i - 1] : 0;
    return std::string_view(text_).substr(begin, ends_[i] - begin);
  }
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size()}; }

 private:
  std::string text_;          // the strings, one after another
  std::vector<size_t> ends_;  // where each one ends in text_
};

}  // namespace ferry::load
