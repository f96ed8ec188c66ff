// The pass protocol's state machine, shared by every KvCache implementation: it checks each call
// against the protocol (kv_cache.h) and throws Error(kInternal) naming the misuse.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"

namespace kvtier::kv {

class PassState {
 public:
  PassState(uint32_t n_layer, uint32_t n_seqs, int64_t capacity);

  // Checks a begin_pass against the protocol and the sequence's room; opens the pass.
  void begin(const PassInfo& info, int64_t seq_positions);
  void write(uint32_t layer);
  void attend(uint32_t layer);
  // Checks that every layer was written and attended; closes the pass.
  void end();
  void abort() { open_ = false; }
  // Checks a truncate (no pass open, a valid sequence, n within its positions).
  void check_truncate(SeqId seq, int64_t n, int64_t seq_positions) const;
  void check_seq(SeqId seq, const char* call) const;

  bool open() const { return open_; }
  SeqId seq() const { return seq_; }
  int64_t pos0() const { return pos0_; }
  int64_t n() const { return n_; }

 private:
  uint32_t n_layer_;
  uint32_t n_seqs_;
  int64_t capacity_;
  bool open_ = false;
  SeqId seq_ = 0;
  int64_t pos0_ = 0;
  int64_t n_ = 0;
  uint32_t next_write_ = 0;   // the layer the next write must name
  uint32_t next_attend_ = 0;  // the layer the next attend must name
};

}  // namespace kvtier::kv
