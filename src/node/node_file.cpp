// node_file.cpp — see node_file.h for the protocol.
#include "node/node_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "load/range_read.h"
#include "os/memory.h"

namespace ferry::node {
namespace {

constexpr uint64_t k2MiB = uint64_t{2} << 20;
constexpr double kPollSeconds = 0.25;  // how often a wait looks at this rank's own reads

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

uint64_t node_file_piece_bytes(uint64_t size) {
  const uint64_t need = (size + kNodeFileMaxPieces - 1) / kNodeFileMaxPieces;
  return std::max(kNodeFileMinPiece, (need + k2MiB - 1) / k2MiB * k2MiB);
}

std::vector<uint64_t> node_file_parts(uint64_t size, uint32_t ranks) {
  const uint64_t align = size >= uint64_t{ranks} * (uint64_t{8} << 20) ? k2MiB : 4096;
  std::vector<uint64_t> bounds;
  bounds.reserve(ranks + 1);
  // size * r / ranks without overflow: size < 2^63 and r < 2^8 can still pass
  // 64 bits, so divide first and add the remainder's share.
  for (uint32_t r = 0; r < ranks; ++r) {
    const uint64_t share = size / ranks * r + size % ranks * r / ranks;
    bounds.push_back(share / align * align);
  }
  bounds.push_back(size);
  return bounds;
}

NodeFileRead::NodeFileRead(const std::string& path, std::string name) : name_(std::move(name)) {
  if (int err = os::open_for_reading(path.c_str(), false, &fd_)) throw OsError("open of " + name_, err);
  if (int err = os::file_identity(fd_, &identity_)) {
    os::close_fd(fd_);
    fd_ = -1;
    throw OsError("fstat of " + name_, err);
  }
  if (!S_ISREG(identity_.mode)) {  // load_safetensors refuses these alike
    os::close_fd(fd_);
    fd_ = -1;
    throw InvalidArgument(name_ + ": not a regular file");
  }
}

NodeFileRead::~NodeFileRead() { release(); }

uint32_t NodeFileRead::piece_count() const {
  return piece_bytes_ ? static_cast<uint32_t>((size() + piece_bytes_ - 1) / piece_bytes_) : 0;
}

char* NodeFileRead::data() const { return pool_ ? pool_->data() + block_.offset + kNodeFileHeaderBytes : nullptr; }

void NodeFileRead::join(std::shared_ptr<NodePool> pool, const std::string& key, uint32_t rank, uint32_t ranks,
                        double timeout_s, int read_threads) {
  if (pool_) throw InvalidArgument(name_ + ": this node load already joined its block");
  if (fd_ < 0) throw InvalidArgument(name_ + ": this node load was released");
  if (ranks < 1 || ranks > kNodeFileMaxRanks)
    throw InvalidArgument("ranks=" + std::to_string(ranks) + ": expected 1-" + std::to_string(kNodeFileMaxRanks));
  if (rank >= ranks)
    throw InvalidArgument("rank=" + std::to_string(rank) + ": expected 0-" + std::to_string(ranks - 1));
  if (std::isnan(timeout_s) || timeout_s < 0) throw InvalidArgument("timeout: expected seconds >= 0 (or infinity)");
  if (read_threads < 1 || read_threads > load::kMaxRangeReadThreads)
    throw InvalidArgument("read_threads: expected 1-" + std::to_string(load::kMaxRangeReadThreads));
  piece_bytes_ = node_file_piece_bytes(size());
  if (piece_bytes_ >= uint64_t{1} << 32)  // a piece's word counts its bytes in 32 bits
    throw InvalidArgument(name_ + ": " + std::to_string(size()) + " bytes is more than a node load reads in one " +
                          "file (" + std::to_string(kNodeFileMaxPieces) +
                          " pieces of under 4 GiB); split it into shards");
  timeout_s_ = timeout_s;
  deadline_ = timeout_s >= 1e9 ? INFINITY : now_s() + timeout_s;
  ranks_ = ranks;

  bool created = false;
  block_ = pool->allocate_named(key, kNodeFileHeaderBytes + size(), &created);
  pool_ = std::move(pool);
  holds_block_ = true;
  stats_.made_block = created;
  if (created) {
    pool_->add(word_offset(kNfRanks), ranks);
  } else if (!pool_->wait_at_least(word_offset(kNfRanks), 1, timeout_s >= 1e9 ? kForever : timeout_s)) {
    throw NodeLoadTimeout(name_ + ": the rank that made this file's node block did not set it up within " +
                          seconds_text(timeout_s) +
                          " s (it died, or was stopped); every rank of the node must call the load with the "
                          "same files");
  } else if (uint32_t theirs = pool_->load(word_offset(kNfRanks)); theirs != ranks) {
    throw InvalidArgument(name_ + ": this rank loads with ranks=" + std::to_string(ranks) +
                          ", the rank that made the node block with ranks=" + std::to_string(theirs) +
                          "; every rank must pass the same ranks");
  }
  if (pool_->add(word_offset(kNfClaim + rank), 1) != 0)
    throw InvalidArgument(name_ + ": rank=" + std::to_string(rank) +
                          " is taken by another process of this load; each process of the node needs its own rank");
  const std::vector<uint64_t> bounds = node_file_parts(size(), ranks);
  stats_.part_begin = bounds[rank];
  stats_.part_end = bounds[rank + 1];
  reader_ = std::thread([this, threads = read_threads] { read_part(stats_.part_begin, stats_.part_end, threads); });
}

void NodeFileRead::read_part(uint64_t begin, uint64_t end, int threads) {
  const double t0 = now_s();
  try {
    char* base = data();
    for (uint64_t lo = begin; lo < end;) {  // spans cut where pieces end
      if (stopping_.load(std::memory_order_relaxed)) return;
      const uint64_t piece = lo / piece_bytes_;
      const uint64_t hi = std::min(end, (piece + 1) * piece_bytes_);
      const size_t got = load::read_range(fd_, name_, lo, base + lo, hi - lo, threads);
      if (got < hi - lo)
        throw InvalidArgument(name_ + ": ends at byte " + std::to_string(lo + got) + ", before byte " +
                              std::to_string(hi) + " (the end of the range read): the file is shorter than " +
                              "expected, or shrank while it was read");
      pool_->add(word_offset(kNfPiece + static_cast<uint32_t>(piece)), static_cast<uint32_t>(hi - lo));
      lo = hi;
    }
    os::FileIdentity after;
    if (int err = os::file_identity(fd_, &after)) throw OsError("fstat of " + name_, err);
    if (after.mtime_ns != identity_.mtime_ns)
      throw InvalidArgument(name_ + ": the file changed while it was read; load it again");
    read_seconds_ = now_s() - t0;
    pool_->add(word_offset(kNfArrived), 1);
  } catch (...) {
    std::lock_guard<std::mutex> hold(mu_);
    if (!error_) error_ = std::current_exception();
    read_failed_.store(true, std::memory_order_release);
  }
}

void NodeFileRead::rethrow_read_error() {
  if (!read_failed_.load(std::memory_order_acquire)) return;
  join_reader();
  std::lock_guard<std::mutex> hold(mu_);
  std::rethrow_exception(error_);
}

void NodeFileRead::join_reader() {
  if (reader_.joinable()) reader_.join();
}

void NodeFileRead::wait_word(uint32_t word, uint32_t value, const std::string& what) {
  if (!pool_) throw InvalidArgument(name_ + ": this node load has not joined its block (or was released)");
  const bool reading = reader_.joinable();
  while (true) {
    const double left = deadline_ - now_s();
    const double step = std::max(0.0, reading ? std::min(left, kPollSeconds) : left);
    if (pool_->wait_at_least(word_offset(word), value, std::isinf(step) ? kForever : step)) return;
    rethrow_read_error();
    if (now_s() >= deadline_) {
      const uint32_t arrived = pool_->load(word_offset(kNfArrived));
      throw NodeLoadTimeout(name_ + ": " + std::to_string(arrived) + " of " + std::to_string(ranks_) +
                            " ranks had read their part after " + seconds_text(timeout_s_) + " s, and " + what +
                            " of the file was not in (a rank died, did not call the load, or reads slowly); "
                            "every rank of the node must call it with the same files (a larger timeout= waits "
                            "longer)");
    }
  }
}

void NodeFileRead::wait_piece(uint32_t p) {
  if (p >= piece_count())
    throw InvalidArgument(name_ + ": piece " + std::to_string(p) + " of " + std::to_string(piece_count()));
  const uint64_t lo = uint64_t{p} * piece_bytes_, hi = std::min(size(), lo + piece_bytes_);
  wait_word(kNfPiece + p, static_cast<uint32_t>(hi - lo),
            "bytes [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
}

void NodeFileRead::finish() {
  if (!pool_) throw InvalidArgument(name_ + ": this node load has not joined its block (or was released)");
  join_reader();
  rethrow_read_error();
  stats_.read_seconds = read_seconds_;
  const double t1 = now_s();
  wait_word(kNfArrived, ranks_, "its part");
  stats_.wait_seconds = now_s() - t1;
}

void NodeFileRead::release() noexcept {
  stopping_.store(true, std::memory_order_relaxed);
  join_reader();
  if (holds_block_) {
    holds_block_ = false;
    try {
      pool_->release(block_.offset);
    } catch (...) {  // a forked child's pool refuses: the block stays the parent's
    }
  }
  pool_.reset();
  if (fd_ >= 0) os::close_fd(fd_);
  fd_ = -1;
}

}  // namespace ferry::node
