// strategy.cpp — strategy names, choice, and the machine profile's text form.
#include "copy/strategy.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <sstream>

#include "copy/staging_plan.h"
#include "core/error.h"
#include "core/options.h"
#include "os/memory.h"

namespace ferry {

const char* strategy_name(Strategy s) noexcept {
  switch (s) {
    case Strategy::automatic: return "auto";
    case Strategy::direct: return "direct";
    case Strategy::staged: return "staged";
    case Strategy::pin_in_place: return "pin-in-place";
    case Strategy::hybrid: return "hybrid";
    case Strategy::cuda: return "cuda";
    case Strategy::sm: return "sm";
  }
  return "?";
}

const char* direction_name(Direction d) noexcept { return d == Direction::h2d ? "h2d" : "d2h"; }

const char* backing_name(HostBacking b) noexcept {
  switch (b) {
    case HostBacking::pinned: return "pinned";
    case HostBacking::small_pages: return "4k";
    case HostBacking::thp: return "thp";
    case HostBacking::hugetlb: return "hugetlb";
    case HostBacking::shmem: return "shmem";
    case HostBacking::shmem_thp: return "shmem-thp";
    case HostBacking::unknown: return "unknown";
  }
  return "?";
}

Strategy parse_strategy(const std::string& text) {
  for (Strategy s : {Strategy::automatic, Strategy::direct, Strategy::staged, Strategy::pin_in_place,
                     Strategy::hybrid, Strategy::cuda, Strategy::sm})
    if (text == strategy_name(s)) return s;
  throw InvalidArgument("copy strategy '" + printable(text) +
                        "': expected auto, direct, staged, pin-in-place, hybrid, cuda or sm");
}

MachineProfile MachineProfile::defaults() { return MachineProfile{}; }

std::string format_profile(const MachineProfile& p) {
  std::ostringstream o;
  o << "# ferry machine profile (ferry bench copy --calibrate)\n"
    << "cuda_below_bytes_h2d = " << p.cuda_below_bytes[0] << "\n"
    << "cuda_below_bytes_d2h = " << p.cuda_below_bytes[1] << "\n"
    << "staging_chunk_bytes = " << p.staging_chunk_bytes << "\n"
    << "staging_slots = " << p.staging_slots << "\n"
    << "workers = " << p.workers << "\n"
    << "hybrid_below_bytes = " << p.hybrid_below_bytes << "\n"
    << "hybrid_pinned_share_h2d = " << p.hybrid_pinned_share[0] << "\n"
    << "hybrid_pinned_share_d2h = " << p.hybrid_pinned_share[1] << "\n"
    << "pin_piece_bytes = " << p.pin_piece_bytes << "\n"
    << "eager_chunk_bytes = " << p.eager_chunk_bytes << "\n"
    << "eager_slots = " << p.eager_slots << "\n"
    << "eager_areas = " << p.eager_areas << "\n"
    << "eager_async_below_bytes = " << p.eager_async_below_bytes << "\n"
    << "batch_sm_below_bytes = " << p.batch_sm_below_bytes << "\n"
    << "batch_sm_max_sms = " << p.batch_sm_max_sms << "\n"
    << "batch_sm_launch_bytes = " << p.batch_sm_launch_bytes << "\n";
  return o.str();
}

namespace {
// Every key parse_profile() knows.
constexpr const char* kProfileKeys[] = {
    "cuda_below_bytes",   "cuda_below_bytes_h2d", "cuda_below_bytes_d2h",     "staging_chunk_bytes",
    "staging_slots",      "workers",              "hybrid_below_bytes",       "hybrid_pinned_share_h2d",
    "hybrid_pinned_share_d2h", "pin_piece_bytes", "batch_sm_below_bytes",     "batch_sm_max_sms",
    "batch_sm_launch_bytes", "eager_chunk_bytes",
    "eager_slots",        "eager_areas",          "eager_async_below_bytes"};
}  // namespace

MachineProfile parse_profile(const std::string& text) {
  MachineProfile p;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    size_t eq = line.find('=');
    auto strip = [](std::string s) {
      size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    if (strip(line).empty()) continue;
    // A line is quoted only once its key is a profile's: a file that is not a
    // profile (FERRY_PROFILE=/etc/shadow) has none of its content repeated.
    const std::string at = "profile line " + std::to_string(number);
    if (eq == std::string::npos) throw InvalidArgument(at + ": expected key = value (is this a ferry profile?)");
    const std::string key = strip(line.substr(0, eq)), value = strip(line.substr(eq + 1));
    if (std::find(std::begin(kProfileKeys), std::end(kProfileKeys), key) == std::end(kProfileKeys)) {
      std::string keys;
      for (const char* k : kProfileKeys) keys += std::string(keys.empty() ? "" : ", ") + k;
      throw InvalidArgument(at + ": not a profile key (keys: " + keys + ")");
    }
    const std::string where = at + " '" + printable(strip(line)) + "'";
    auto share = [&] {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end || !(v >= 0 && v <= 1)) throw InvalidArgument(where + ": expected a share 0..1");
      return v;
    };
    auto bytes_in = [&](uint64_t lo, uint64_t hi) {
      const uint64_t v = parse_size(value, where);
      if (v < lo || v > hi)
        throw InvalidArgument(where + ": expected " + format_bytes(lo) + " .. " + format_bytes(hi));
      return static_cast<size_t>(v);
    };
    auto count_in = [&](int64_t lo, int64_t hi) { return static_cast<int>(parse_integer(value, where, lo, hi)); };
    if (key == "cuda_below_bytes") p.cuda_below_bytes[0] = p.cuda_below_bytes[1] = parse_size(value, where);
    else if (key == "cuda_below_bytes_h2d") p.cuda_below_bytes[0] = parse_size(value, where);
    else if (key == "cuda_below_bytes_d2h") p.cuda_below_bytes[1] = parse_size(value, where);
    else if (key == "staging_chunk_bytes") p.staging_chunk_bytes = bytes_in(4096, kMaxStagingChunkBytes);
    else if (key == "staging_slots") p.staging_slots = count_in(2, kMaxStagingSlots);
    else if (key == "workers") p.workers = count_in(0, kMaxThreads);
    else if (key == "hybrid_below_bytes") p.hybrid_below_bytes = parse_size(value, where);
    else if (key == "hybrid_pinned_share_h2d") p.hybrid_pinned_share[0] = share();
    else if (key == "hybrid_pinned_share_d2h") p.hybrid_pinned_share[1] = share();
    else if (key == "pin_piece_bytes") p.pin_piece_bytes = bytes_in(os::kHugePage2MBytes, kMaxPinPieceBytes);
    else if (key == "batch_sm_below_bytes") p.batch_sm_below_bytes = parse_size(value, where);
    else if (key == "batch_sm_max_sms") p.batch_sm_max_sms = count_in(0, 1024);
    else if (key == "batch_sm_launch_bytes") {
      const uint64_t v = parse_size(value, where);
      if (v != 0 && (v < 4096 || v > (uint64_t{1} << 30)))
        throw InvalidArgument(where + ": expected 0 (one launch per call) or 4 KiB .. 1 GiB");
      p.batch_sm_launch_bytes = static_cast<size_t>(v);
    }
    else if (key == "eager_chunk_bytes") p.eager_chunk_bytes = bytes_in(1, kMaxStagingChunkBytes);
    else if (key == "eager_slots") p.eager_slots = count_in(1, 4096);
    else if (key == "eager_areas") p.eager_areas = count_in(1, 64);
    else if (key == "eager_async_below_bytes") p.eager_async_below_bytes = parse_size(value, where);
    else throw InvalidArgument(where + ": unknown key '" + key + "'");
  }
  if (p.eager_chunk_bytes % kFragmentAlign)
    throw InvalidArgument("profile: eager_chunk_bytes must be a multiple of " + std::to_string(kFragmentAlign));
  if (p.pin_piece_bytes % os::kHugePage2MBytes)
    throw InvalidArgument("profile: pin_piece_bytes must be a multiple of 2 MiB");
  return p;
}

const char* path_name(Path p) noexcept {
  switch (p) {
    case Path::dma: return "dma";
    case Path::cuda: return "cuda";
    case Path::sm_kernel: return "sm-kernel";
    case Path::eager: return "eager";
    case Path::streamed: return "streamed";
    case Path::pin_in_place: return "pin-in-place";
  }
  return "?";
}

namespace {

Strategy choose(const CopyFacts& f, const MachineProfile& profile, Strategy requested) {
  const int d = static_cast<int>(f.dir);
  const bool pinned = f.device_to_device || f.backing == HostBacking::pinned;
  if (pinned) {
    if (requested == Strategy::sm && !f.device_to_device) return Strategy::sm;
    const bool small_batch = f.batch_pinned_mean_bytes > 0 && f.batch_pinned_mean_bytes < profile.batch_sm_below_bytes;
    return requested == Strategy::automatic && small_batch ? Strategy::sm : Strategy::direct;
  }
  // "direct" asked for pageable memory means the plain CUDA call; the SM
  // kernel needs pinned memory, so pageable memory is staged instead.
  if (requested == Strategy::direct) return Strategy::cuda;
  if (requested == Strategy::sm) return Strategy::staged;
  if (requested != Strategy::automatic) return requested;
  if (f.bytes < profile.cuda_below_bytes[d]) return Strategy::cuda;
  const double share = profile.hybrid_pinned_share[d];
  if (f.bytes >= profile.hybrid_below_bytes && share > 0) return share >= 1.0 ? Strategy::pin_in_place : Strategy::hybrid;
  return Strategy::staged;
}

// Eager while the caller may wait for staging: synchronous calls, and async
// host->device copies (a batch's always, one copy's below
// eager_async_below_bytes); the stream-ordered pipeline returns at once.
Path staged_path(const CopyFacts& f, const MachineProfile& profile) {
  switch (f.call) {
    case CallKind::copy:
    case CallKind::copy_many: return Path::eager;
    case CallKind::copy_many_async: return f.dir == Direction::h2d ? Path::eager : Path::streamed;
    case CallKind::copy_async: break;
  }
  return f.dir == Direction::h2d && f.bytes < profile.eager_async_below_bytes ? Path::eager : Path::streamed;
}

}  // namespace

Route choose_route(const CopyFacts& f, const MachineProfile& profile, Strategy requested) {
  const Strategy s = choose(f, profile, requested);
  switch (s) {
    case Strategy::direct: return {s, Path::dma, f.dir};
    case Strategy::cuda: return {s, Path::cuda, f.dir};
    case Strategy::sm: return {s, Path::sm_kernel, f.dir};
    case Strategy::pin_in_place:
    case Strategy::hybrid: return {s, Path::pin_in_place, f.dir};
    case Strategy::staged:
    case Strategy::automatic: break;
  }
  return {Strategy::staged, staged_path(f, profile), f.dir};
}

Strategy choose_strategy(Direction dir, size_t bytes, HostBacking backing, const MachineProfile& profile,
                         Strategy requested) {
  CopyFacts f;
  f.dir = dir;
  f.bytes = bytes;
  f.backing = backing;
  return choose_route(f, profile, requested).strategy;
}

}  // namespace ferry
