// node_file.h — the node load's protocol: every rank of a node reads its part
// of one file into one named block of the node pool, and each takes the
// file's pieces as they come in, whoever read them (python/ferry/torch/
// node_load.py binds it for load_safetensors(node=)).
//
// Protocol (every rank of the load opens the same file with the same ranks)
// ---------------------------------------------------------------------------
// The block: the node pool's named block `key` (the caller's: a hash of the
// file's identity and this process's count of node loads of it, so a new load
// never meets an earlier one's words), kNodeFileHeaderBytes of 32-bit signal
// words, then the file's bytes. The pool zeroes a named block's first 4 KiB
// when it makes it, so every word starts at 0.
//   word 1  RANKS     written by the block's maker (add), last: the ranks
//                     taking part; the others wait for it (at most the
//                     timeout) before they trust any word
//   word 2  ARRIVED   each rank adds 1 once its whole part is in
//   word 8+r CLAIM    rank r adds 1: a second process given the same rank
//                     sees 1 before it and is refused
//   word 512+p PIECE  every rank adds the bytes of piece p it has read: the
//                     piece is in once its word reaches the piece's length
// Parts: rank r reads file bytes [parts[r], parts[r+1]) (node_file_parts:
// contiguous, 2 MiB aligned, 4 KiB for small files). Pieces: the file cut
// every node_file_piece_bytes(size) bytes (at least kNodeFileMinPiece, at most
// kNodeFileMaxPieces of them, each under 4 GiB: a word counts 32 bits).
//
// States of piece p: reading (word < length) -> in (word == length). A rank
// waits for piece p (wait_piece) while its own reads go on, on a thread of its
// own, span by span in file order; so the caller copies piece p out while
// piece p+1 is read. After its last span a rank checks that the file did not
// change meanwhile (its mtime), then adds ARRIVED. finish() waits for this
// rank's reads and for ARRIVED == ranks.
//
// Waits are bounded by one deadline per load (timeout_s from join; kForever:
// none); a rank that never comes or dies leaves the others a NodeLoadTimeout
// that says how many ranks arrived. A wait also ends with this rank's own
// read error as soon as the reader thread records it (polled every 0.25 s).
// The block is freed when the last rank releases it: no second barrier.
//
// Threads: one reader thread per NodeFileRead (its reads use
// load::read_range's threads). mu_ guards error_ only; the reader publishes
// progress through the pool's words, never through this object.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "node/node_pool.h"
#include "os/file.h"

namespace ferry::node {

constexpr uint64_t kNodeFileHeaderBytes = 4096;
constexpr uint32_t kNodeFileMaxRanks = 256;
constexpr uint32_t kNodeFileMaxPieces = 512;
constexpr uint64_t kNodeFileMinPiece = uint64_t{64} << 20;

// Signal words of the block's header (see the protocol above).
enum NodeFileWord : uint32_t { kNfRanks = 1, kNfArrived = 2, kNfClaim = 8, kNfPiece = 512 };

// The piece length of a file of `size` bytes: at least kNodeFileMinPiece, a
// multiple of 2 MiB, at most kNodeFileMaxPieces pieces.
uint64_t node_file_piece_bytes(uint64_t size);

// The ranks + 1 bounds of the ranks' parts of a file of `size` bytes.
std::vector<uint64_t> node_file_parts(uint64_t size, uint32_t ranks);

// Ranks of a node load did not all arrive (or the block's maker did not set
// it up) within the load's timeout. Python: ferry.errors.NodeLoadTimeoutError.
class NodeLoadTimeout : public Error {
 public:
  explicit NodeLoadTimeout(const std::string& m) : Error(FERRY_ERROR_TIMEOUT, m) {}
};

struct NodeFileStats {
  uint64_t part_begin = 0, part_end = 0;  // this rank's part of the file
  double read_seconds = -1;               // this rank's reads (-1: not finished)
  double wait_seconds = -1;               // finish()'s wait for the other ranks
  bool made_block = false;                // this rank made the block
};

class NodeFileRead {
 public:
  // Opens `path` for reading: a regular file only (InvalidArgument "NAME: not
  // a regular file" for a FIFO, a device, a directory; a FIFO's open never
  // waits); OsError for a failed open. `name` is the path in messages.
  NodeFileRead(const std::string& path, std::string name);
  ~NodeFileRead();  // release()
  NodeFileRead(const NodeFileRead&) = delete;
  NodeFileRead& operator=(const NodeFileRead&) = delete;

  const os::FileIdentity& identity() const { return identity_; }
  const std::string& name() const { return name_; }

  // Collective: makes or finds the block `key` in `pool`, checks and claims
  // `rank` of `ranks`, and starts this rank's reads on a thread; returns
  // without waiting for them. InvalidArgument: bad rank/ranks, ranks or rank
  // that disagree with the others', a file too large for 32-bit piece words;
  // NodeLoadTimeout: the block's maker did not set it up in time;
  // OutOfMemory: the pool is full. Called once.
  void join(std::shared_ptr<NodePool> pool, const std::string& key, uint32_t rank, uint32_t ranks,
            double timeout_s, int read_threads);

  uint64_t size() const { return identity_.size; }
  uint64_t piece_bytes() const { return piece_bytes_; }
  uint32_t piece_count() const;
  NodeBlock block() const { return block_; }
  // The file's first byte in this process's mapping of the pool.
  char* data() const;
  NodeFileStats stats() const { return stats_; }

  // Waits until every rank's bytes of piece p are in the block. Throws this
  // rank's read error as soon as there is one, NodeLoadTimeout at the deadline.
  void wait_piece(uint32_t p);
  // Waits for this rank's reads (throwing their error) and for every rank's
  // arrival; fills in the stats.
  void finish();
  // Stops this rank's reads (after the span being read), closes the file and
  // lets go of the block. Safe to call twice.
  void release() noexcept;

 private:
  void read_part(uint64_t begin, uint64_t end, int threads);  // the reader thread
  void wait_word(uint32_t word, uint32_t value, const std::string& what);
  void rethrow_read_error();
  void join_reader();
  uint64_t word_offset(uint32_t word) const { return block_.offset + 4 * uint64_t{word}; }

  std::string name_;
  int fd_ = -1;
  os::FileIdentity identity_;
  std::shared_ptr<NodePool> pool_;
  NodeBlock block_;
  bool holds_block_ = false;
  uint32_t ranks_ = 0;
  uint64_t piece_bytes_ = 0;
  double timeout_s_ = 0;
  double deadline_ = 0;  // steady clock seconds; infinity: none
  NodeFileStats stats_;
  std::thread reader_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> read_failed_{false};
  std::mutex mu_;              // guards error_ (the reader sets it, waits read it)
  std::exception_ptr error_;   // the reader's first error
  double read_seconds_ = -1;   // written by the reader before it ends (read after join)
};

}  // namespace ferry::node
