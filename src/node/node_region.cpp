// node_region.cpp — allocation, members and named blocks inside the shared region.
#include "node/node_region.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace ferry::node {
namespace {

constexpr uint64_t kMembersOffset = 4096;
constexpr uint64_t kNamedOffset = kMembersOffset + kMaxMembers * sizeof(Member);
constexpr uint64_t kArraysOffset = kNamedOffset + kMaxNamed * sizeof(Named);

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

bool has_bit(const Named& n, uint32_t slot) { return (n.holders[slot / 64] >> (slot % 64)) & 1; }
void set_bit(Named& n, uint32_t slot) { n.holders[slot / 64] |= uint64_t{1} << (slot % 64); }
void clear_bit(Named& n, uint32_t slot) { n.holders[slot / 64] &= ~(uint64_t{1} << (slot % 64)); }
bool no_bits(const Named& n) {
  for (uint64_t w : n.holders)
    if (w) return false;
  return true;
}

}  // namespace

size_t utf8_prefix_bytes(std::string_view text, size_t max_bytes) {
  const size_t whole = std::min(text.find('\0'), text.size());
  if (whole <= max_bytes) return whole;
  auto continuation = [&](size_t i) { return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80; };
  size_t cut = max_bytes;  // text[cut] is the first byte left out: it must start a character
  for (int back = 0; back < 3 && cut > 0 && continuation(cut); ++back) --cut;
  return continuation(cut) ? max_bytes : cut;
}

Region::Layout Region::layout(uint64_t capacity, uint64_t granule) {
  Layout l{};
  l.granules = capacity / granule;
  l.owner_offset = kArraysOffset;
  l.head_offset = round_up(l.owner_offset + l.granules * sizeof(uint16_t), 4096);
  l.data_offset = round_up(l.head_offset + l.granules * sizeof(uint32_t), uint64_t{2} << 20);
  l.file_bytes = round_up(l.data_offset + capacity, uint64_t{2} << 20);
  return l;
}

void Region::init(uint64_t capacity, uint64_t granule, int creator_pid, uint64_t page_bytes) {
  const Layout l = layout(capacity, granule);
  Header& h = header();
  h.version = kVersion;
  h.creator_pid = static_cast<uint32_t>(creator_pid);
  h.capacity = capacity;
  h.granule = granule;
  h.granules = l.granules;
  h.owner_offset = l.owner_offset;
  h.head_offset = l.head_offset;
  h.data_offset = l.data_offset;
  h.file_bytes = l.file_bytes;
  h.page_bytes = page_bytes;
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h.lock, &a);
  pthread_mutexattr_destroy(&a);
  // The magic last: an attacher that checks it sees a whole header.
  std::atomic_ref<uint64_t>(h.magic).store(kMagic, std::memory_order_release);
}

std::string Region::header_problem(uint64_t file_bytes) const {
  const Header& h = header();
  if (std::atomic_ref<uint64_t>(const_cast<uint64_t&>(h.magic)).load(std::memory_order_acquire) != kMagic)
    return "no node pool header";
  if (h.version != kVersion) return "version " + std::to_string(h.version) + ", not " + std::to_string(kVersion);
  if (h.granule < 4096 || h.granule > (uint64_t{1} << 30) || (h.granule & (h.granule - 1)))
    return "granule " + std::to_string(h.granule);
  if (h.granules == 0 || h.granules >= (uint64_t{1} << 32) || h.capacity != h.granules * h.granule)
    return "capacity " + std::to_string(h.capacity) + " is not " + std::to_string(h.granules) + " granules";
  const Layout l = layout(h.capacity, h.granule);
  if (h.owner_offset != l.owner_offset || h.head_offset != l.head_offset || h.data_offset != l.data_offset ||
      h.file_bytes != l.file_bytes || l.file_bytes != file_bytes)
    return "its layout does not match its capacity and a file of " + std::to_string(file_bytes) + " bytes";
  return "";
}

Member& Region::member(uint32_t slot) const {
  return reinterpret_cast<Member*>(base_ + kMembersOffset)[slot];
}
Named& Region::named(uint32_t index) const { return reinterpret_cast<Named*>(base_ + kNamedOffset)[index]; }

bool Region::lock() {
  bool repaired = false;
  lock_for(-1, &repaired);
  return repaired;
}

int Region::lock_for(int64_t timeout_ns, bool* repaired) {
  int rc;
  if (timeout_ns < 0) {
    rc = pthread_mutex_lock(&header().lock);
  } else {
    // trylock, not timedlock: ThreadSanitizer's timedlock does not count EOWNERDEAD as
    // locked. The lock is held for microseconds; a wait here is rare (an open whose
    // member holds it) and polls from 20 us up to 1 ms apart.
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
    auto pause = std::chrono::microseconds(20);
    while ((rc = pthread_mutex_trylock(&header().lock)) == EBUSY) {
      if (std::chrono::steady_clock::now() >= until) return ETIMEDOUT;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
  *repaired = rc == EOWNERDEAD;
  if (rc == EOWNERDEAD) {  // the holder died inside a step: rebuild, then go on
    repair();
    header().repairs++;
    pthread_mutex_consistent(&header().lock);
    return 0;
  }
  return rc;
}

void Region::unlock() { pthread_mutex_unlock(&header().lock); }

uint32_t Region::claim_member(int pid, const std::string& label) {
  for (uint32_t s = 0; s < kMaxMembers; ++s) {
    Member& m = member(s);
    if (m.live) continue;
    std::memset(&m, 0, sizeof m);
    m.pid = pid;
    std::memcpy(m.label, label.data(), utf8_prefix_bytes(label, kLabelBytes - 1));
    m.live = 1;
    return s;
  }
  return kMaxMembers;
}

bool Region::has_live_member() const {
  for (uint32_t s = 0; s < kMaxMembers; ++s)
    if (member(s).live) return true;
  return false;
}

void Region::release_member(uint32_t slot) {
  const Header& h = header();
  const uint16_t mine = static_cast<uint16_t>(slot + 1);
  for (uint64_t g = 0; g < h.granules;) {
    const uint64_t n = head()[g];
    if (n && owner()[g] == mine) free_block(g);
    g += n ? n : 1;
  }
  for (uint32_t i = 0; i < kMaxNamed; ++i)
    if (named(i).used && has_bit(named(i), slot)) drop_named(i, slot);
  std::memset(&member(slot), 0, sizeof(Member));
}

uint64_t Region::allocate(uint32_t slot, uint64_t count) {
  Header& h = header();
  if (count == 0 || count > h.granules - h.used_granules) return kNone;
  uint16_t* own = owner();
  // Next fit: from where the last search ended, wrapping once.
  uint64_t start = h.next_fit < h.granules ? h.next_fit : 0, run = 0, first = 0;
  for (uint64_t step = 0; step < h.granules + count; ++step) {
    const uint64_t g = (start + step) % h.granules;
    if (g == 0) run = 0;  // a run does not wrap around the end
    if (own[g] != 0) {
      run = 0;
      const uint64_t n = head()[g];
      if (n > 1) step += n - 1;  // skip the rest of a committed block
      continue;
    }
    if (run++ == 0) first = g;
    if (run == count) {
      const uint16_t who = slot == kMaxMembers ? kNamedOwner : static_cast<uint16_t>(slot + 1);
      for (uint64_t i = first; i < first + count; ++i) own[i] = who;
      std::atomic_ref<uint32_t>(head()[first]).store(static_cast<uint32_t>(count), std::memory_order_release);
      h.used_granules += count;
      h.next_fit = first + count;
      if (slot != kMaxMembers) {
        member(slot).bytes += count * h.granule;
        member(slot).blocks++;
      }
      return first;
    }
  }
  return kNone;
}

uint64_t Region::block_count(uint64_t first) const {
  return first < header().granules ? head()[first] : 0;
}
uint16_t Region::block_owner(uint64_t first) const { return owner()[first]; }

void Region::free_granules(uint64_t first, uint64_t count) {
  std::atomic_ref<uint32_t>(head()[first]).store(0, std::memory_order_release);  // uncommit first
  for (uint64_t i = first; i < first + count; ++i) owner()[i] = 0;
  header().used_granules -= count;
}

void Region::free_block(uint64_t first) {
  const uint64_t count = head()[first];
  const uint16_t who = owner()[first];
  if (who != kNamedOwner && who != 0) {
    Member& m = member(who - 1u);
    m.bytes -= count * header().granule;
    m.blocks--;
  }
  free_granules(first, count);
}

void Region::give(uint64_t first, uint32_t slot) {
  const uint64_t count = head()[first];
  const uint64_t bytes = count * header().granule;
  Member& from = member(owner()[first] - 1u);
  from.bytes -= bytes;
  from.blocks--;
  for (uint64_t i = first; i < first + count; ++i) owner()[i] = static_cast<uint16_t>(slot + 1);
  member(slot).bytes += bytes;
  member(slot).blocks++;
}

uint32_t Region::find_named(const std::string& key) const {
  for (uint32_t i = 0; i < kMaxNamed; ++i)
    if (named(i).used && std::strncmp(named(i).key, key.c_str(), kKeyBytes) == 0) return i;
  return kMaxNamed;
}

uint32_t Region::create_named(const std::string& key, uint64_t first, uint64_t count, uint32_t slot) {
  for (uint32_t i = 0; i < kMaxNamed; ++i) {
    Named& n = named(i);
    if (n.used) continue;
    std::memset(&n, 0, sizeof n);
    std::strncpy(n.key, key.c_str(), kKeyBytes - 1);
    n.first = first;
    n.count = count;
    set_bit(n, slot);
    member(slot).named++;
    std::atomic_ref<uint32_t>(n.used).store(1, std::memory_order_release);
    return i;
  }
  return kMaxNamed;
}

uint32_t Region::named_of_block(uint64_t first) const {
  for (uint32_t i = 0; i < kMaxNamed; ++i)
    if (named(i).used && named(i).first == first) return i;
  return kMaxNamed;
}

bool Region::holds_named(uint32_t index, uint32_t slot) const { return has_bit(named(index), slot); }

void Region::hold_named(uint32_t index, uint32_t slot) {
  if (has_bit(named(index), slot)) return;
  set_bit(named(index), slot);
  member(slot).named++;
}

void Region::drop_named(uint32_t index, uint32_t slot) {
  Named& n = named(index);
  if (!has_bit(n, slot)) return;
  clear_bit(n, slot);
  member(slot).named--;
  if (no_bits(n)) {
    n.used = 0;
    free_granules(n.first, n.count);
  }
}

uint64_t Region::largest_free_run() const {
  uint64_t best = 0, run = 0;
  for (uint64_t g = 0; g < header().granules; ++g) {
    run = owner()[g] == 0 ? run + 1 : 0;
    if (run > best) best = run;
  }
  return best * header().granule;
}

std::vector<HolderInfo> Region::holders() const {
  std::vector<HolderInfo> out;
  for (uint32_t s = 0; s < kMaxMembers; ++s) {
    const Member& m = member(s);
    if (!m.live) continue;
    out.push_back({s, m.pid, std::string(m.label, strnlen(m.label, kLabelBytes)), m.bytes, m.blocks, m.named});
  }
  return out;
}

void Region::repair() {
  Header& h = header();
  uint16_t* own = owner();
  uint32_t* hd = head();
  for (uint32_t s = 0; s < kMaxMembers; ++s) member(s).bytes = member(s).blocks = member(s).named = 0;
  h.used_granules = 0;
  for (uint64_t g = 0; g < h.granules;) {
    const uint64_t n = hd[g];
    const uint16_t who = own[g];
    const bool valid = n > 0 && g + n <= h.granules && who != 0 &&
                       (who == kNamedOwner || (who - 1u < kMaxMembers && member(who - 1u).live));
    if (!valid) {  // not a committed block, or one whose owner is gone
      hd[g] = 0;
      own[g] = 0;
      ++g;
      continue;
    }
    for (uint64_t i = g; i < g + n; ++i) own[i] = who;
    h.used_granules += n;
    if (who != kNamedOwner) {
      member(who - 1u).bytes += n * h.granule;
      member(who - 1u).blocks++;
    }
    g += n;
  }
  // Named entries: keep those whose block is committed and named; count holds.
  std::vector<bool> named_block(h.granules, false);
  for (uint32_t i = 0; i < kMaxNamed; ++i) {
    Named& e = named(i);
    if (!e.used) continue;
    bool ok = e.first < h.granules && hd[e.first] == e.count && own[e.first] == kNamedOwner &&
              !named_block[e.first];
    for (uint32_t s = 0; ok && s < kMaxMembers; ++s)
      if (has_bit(e, s) && !member(s).live) clear_bit(e, s);
    if (ok && no_bits(e)) ok = false;
    if (!ok) {
      if (e.first < h.granules && hd[e.first] == e.count && own[e.first] == kNamedOwner && !named_block[e.first])
        free_granules(e.first, e.count);
      e.used = 0;
      continue;
    }
    named_block[e.first] = true;
    for (uint32_t s = 0; s < kMaxMembers; ++s)
      if (has_bit(e, s)) member(s).named++;
  }
  for (uint64_t g = 0; g < h.granules;) {  // named blocks that lost their entry
    const uint64_t n = hd[g];
    if (n && own[g] == kNamedOwner && !named_block[g]) free_granules(g, n);
    g += n ? n : 1;
  }
}

}  // namespace ferry::node
