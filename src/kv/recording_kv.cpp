#include "kv/recording_kv.h"

namespace kvtier::kv {

std::span<const PassPositions> RecordingKv::begin_batch(std::span<const PassInfo> seqs) {
  const std::span<const PassPositions> p = inner_.begin_batch(seqs);
  pass_rows_ = 0;
  for (const PassInfo& s : seqs) pass_rows_ += s.n;
  return p;
}

void RecordingKv::write(uint32_t layer, const LayerRows& rows) {
  inner_.write(layer, rows);  // first: a misuse of the protocol throws before anything is recorded
  observer_.on_write(layer, rows, pass_rows_);
}

void RecordingKv::attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) {
  inner_.attend(layer, q, n_head, la, o);
  observer_.on_queries(layer, q, pass_rows_, n_head);
}

}  // namespace kvtier::kv
