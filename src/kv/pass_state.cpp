#include "kv/pass_state.h"

#include "core/error.h"

namespace kvtier::kv {

PassState::PassState(uint32_t n_layer, uint32_t n_seqs, int64_t capacity)
    : n_layer_(n_layer), n_seqs_(n_seqs), capacity_(capacity) {}

void PassState::check_seq(SeqId seq, const char* call) const {
  if (seq >= n_seqs_) {
    fail(ErrorKind::kInternal, "KV {}: sequence {} does not exist (the cache holds {})", call, seq, n_seqs_);
  }
}

void PassState::begin(const PassInfo& info, int64_t seq_positions) {
  if (open_) {
    fail(ErrorKind::kInternal,
         "KV begin_pass: the pass of sequence {} is still open (end_pass or abort_pass first)", seq_);
  }
  check_seq(info.seq, "begin_pass");
  if (info.n <= 0) fail(ErrorKind::kInternal, "KV begin_pass: a pass of {} tokens", info.n);
  if (seq_positions + info.n > capacity_) {
    fail(ErrorKind::kBudget, "context of {} positions is full ({} needed): raise --ctx", capacity_,
         seq_positions + info.n);
  }
  open_ = true;
  seq_ = info.seq;
  pos0_ = seq_positions;
  n_ = info.n;
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
  if (open_) fail(ErrorKind::kInternal, "KV truncate during the open pass of sequence {}", seq_);
  check_seq(seq, "truncate");
  if (n < 0 || n > seq_positions) {
    fail(ErrorKind::kInternal, "KV truncate of sequence {} to {} positions: it holds {}", seq, n,
         seq_positions);
  }
}

}  // namespace kvtier::kv
