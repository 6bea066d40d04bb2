// stats.cpp — invariant checks and descriptions of pool statistics.
#include "pool/stats.h"

#include "core/error.h"

namespace ferry {
namespace {

const char* kind_name(int k) { return k == static_cast<int>(PageKind::huge) ? "huge" : "small"; }

}  // namespace

std::string accounting_violation(const PoolStats& s) {
  for (int k = 0; k < 2; ++k) {
    const KindStats& c = s.kind[k];
    if (c.reserved.current != c.committed.current + c.released.current)
      return std::string(kind_name(k)) + ": reserved " + std::to_string(c.reserved.current) +
             " != committed " + std::to_string(c.committed.current) + " + released " +
             std::to_string(c.released.current);
    if (c.committed.current != c.in_use.current + c.cached.current)
      return std::string(kind_name(k)) + ": committed " + std::to_string(c.committed.current) +
             " != in_use " + std::to_string(c.in_use.current) + " + cached " +
             std::to_string(c.cached.current);
  }
  return "";
}

std::string describe(const PoolStats& s) {
  std::string out;
  for (int k = 0; k < 2; ++k) {
    const KindStats& c = s.kind[k];
    out += std::string(kind_name(k)) + ": reserved " + format_bytes(c.reserved.current) +
           ", committed " + format_bytes(c.committed.current) + ", in use " +
           format_bytes(c.in_use.current) + ", cached " + format_bytes(c.cached.current) +
           ", released " + format_bytes(c.released.current) + "\n";
  }
  return out;
}

}  // namespace ferry
