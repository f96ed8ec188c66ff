// The pass protocol's state machine, shared by every KvCache implementation: it checks each call
// against the protocol (kv_cache.h) and throws Error(kInternal) naming the misuse. It also holds the
// open pass's sequences: each one's id, first new position, token count and first row in the pass.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache.h"

namespace kvtier::kv {

// One sequence of the open pass: its new tokens are positions [pos0, pos0 + n) and rows
// [row0, row0 + n) of the pass's buffers.
struct SeqPass {
  SeqId seq = 0;
  int64_t pos0 = 0;
  int64_t n = 0;
  int64_t row0 = 0;
};

class PassState {
 public:
  PassState(uint32_t n_layer, uint32_t n_seqs, int64_t capacity);

  // Checks a begin_batch against the protocol and each sequence's room (seq_positions[s]: the tokens
  // sequence s holds); opens the pass.
  void begin(std::span<const PassInfo> seqs, std::span<const int64_t> seq_positions);
  void write(uint32_t layer);
  void attend(uint32_t layer);
  // Checks that every layer was written and attended; closes the pass.
  void end();
  void abort() { open_ = false; }
  // Checks a truncate (no pass open, a valid sequence, n within its positions).
  void check_truncate(SeqId seq, int64_t n, int64_t seq_positions) const;
  void check_seq(SeqId seq, const char* call) const;

  bool open() const { return open_; }
  // The open (or last) pass's sequences, in batch order.
  std::span<const SeqPass> seqs() const { return seqs_; }
  // Their positions, as begin_batch returns them.
  std::span<const PassPositions> positions() const { return positions_; }
  // Tokens of the pass, all sequences together.
  int64_t total() const { return total_; }
  // Counts passes begun (tells one pass's writes from another's).
  uint64_t serial() const { return serial_; }

 private:
  uint32_t n_layer_;
  uint32_t n_seqs_;
  int64_t capacity_;
  bool open_ = false;
  std::vector<SeqPass> seqs_;             // [batch] capacity n_seqs, reserved up front
  std::vector<PassPositions> positions_;  // [batch]
  std::vector<uint8_t> in_pass_;          // [n_seqs] 1 while a sequence is in the batch being checked
  int64_t total_ = 0;
  uint64_t serial_ = 0;
  uint32_t next_write_ = 0;   // the layer the next write must name
  uint32_t next_attend_ = 0;  // the layer the next attend must name
};

}  // namespace kvtier::kv
