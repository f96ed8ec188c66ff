#include "kv/pass_state.h"

#include "core/error.h"

namespace kvtier::kv {

PassState::PassState(uint32_t n_layer, uint32_t n_seqs, int64_t capacity)
    : n_layer_(n_layer), n_seqs_(n_seqs), capacity_(capacity) {
  seqs_.reserve(n_seqs);
  positions_.reserve(n_seqs);
  in_pass_.assign(n_seqs, 0);
}

void PassState::check_seq(SeqId seq, const char* call) const {
  if (seq >= n_seqs_) {
    fail(ErrorKind::kInternal, "KV {}: sequence {} does not exist (the cache holds {})", call, seq, n_seqs_);
  }
}

void PassState::begin(std::span<const PassInfo> seqs, std::span<const int64_t> seq_positions) {
  if (open_) {
    fail(ErrorKind::kInternal,
         "KV begin_pass: the pass of sequence {} is still open (end_pass or abort_pass first)",
         seqs_.empty() ? 0 : seqs_[0].seq);
  }
  if (seqs.empty()) fail(ErrorKind::kInternal, "KV begin_batch of no sequences");
  for (const PassInfo& info : seqs) check_seq(info.seq, "begin_pass");
  for (const PassInfo& info : seqs) {
    if (info.n <= 0) fail(ErrorKind::kInternal, "KV begin_pass: a pass of {} tokens", info.n);
    if (seq_positions[info.seq] + info.n > capacity_) {
      fail(ErrorKind::kBudget, "context of {} positions is full ({} needed): raise --ctx", capacity_,
           seq_positions[info.seq] + info.n);
    }
  }
  // Distinct sequences: in_pass_ marks them while checking and is cleared again either way.
  bool repeated = false;
  SeqId rep = 0;
  for (const PassInfo& info : seqs) {
    if (in_pass_[info.seq] != 0 && !repeated) {
      repeated = true;
      rep = info.seq;
    }
    in_pass_[info.seq] = 1;
  }
  for (const PassInfo& info : seqs) in_pass_[info.seq] = 0;
  if (repeated) fail(ErrorKind::kInternal, "KV begin_batch: sequence {} appears twice in one pass", rep);
  seqs_.clear();
  positions_.clear();
  total_ = 0;
  for (const PassInfo& info : seqs) {
    seqs_.push_back({info.seq, seq_positions[info.seq], info.n, total_});
    positions_.push_back({seq_positions[info.seq], info.n});
    total_ += info.n;
  }
  open_ = true;
  ++serial_;
  next_write_ = 0;
  next_attend_ = 0;
}

void PassState::write(uint32_t layer) {
  if (!open_) fail(ErrorKind::kInternal, "KV write(layer {}) outside a pass (begin_pass first)", layer);
  if (layer != next_write_) {
    fail(ErrorKind::kInternal,
         "KV write(layer {}): layer {} is next (layers are written once each, in order)", layer, next_write_);
  }
  ++next_write_;
}

void PassState::attend(uint32_t layer) {
  if (!open_) fail(ErrorKind::kInternal, "KV attend(layer {}) outside a pass (begin_pass first)", layer);
  if (layer >= next_write_) {
    fail(ErrorKind::kInternal, "KV attend(layer {}) before its write", layer);
  }
  if (layer != next_attend_) {
    fail(ErrorKind::kInternal,
         "KV attend(layer {}): layer {} is next (each layer is attended once, in order)", layer,
         next_attend_);
  }
  ++next_attend_;
}

void PassState::end() {
  if (!open_) fail(ErrorKind::kInternal, "KV end_pass without an open pass");
  if (next_write_ != n_layer_) {
    fail(ErrorKind::kInternal, "KV end_pass: layer {} of {} was not written", next_write_, n_layer_);
  }
  if (next_attend_ != n_layer_) {
    fail(ErrorKind::kInternal, "KV end_pass: layer {} of {} was not attended", next_attend_, n_layer_);
  }
  open_ = false;
}

void PassState::check_truncate(SeqId seq, int64_t n, int64_t seq_positions) const {
  if (open_) fail(ErrorKind::kInternal, "KV truncate during the open pass of sequence {}", seqs_[0].seq);
  check_seq(seq, "truncate");
  if (n < 0 || n > seq_positions) {
    fail(ErrorKind::kInternal, "KV truncate of sequence {} to {} positions: it holds {}", seq, n,
         seq_positions);
  }
}

}  // namespace kvtier::kv
