// Pure KIVI decisions: which positions a sequence stores quantised, and how many full-precision
// blocks that leaves per (sequence, layer, head group). The kv layer applies them.
//
// A position is quantised once its whole key group (key_group consecutive positions, aligned to
// multiples of key_group) has left the residual window, i.e. lies below length - residual. Keys and
// values flush together at group granularity, so up to key_group - 1 tokens beyond the residual window
// stay in f16. The flush happens when a pass ends: the pass's own attention still sees its tokens in
// f16.
#pragma once

#include <cstdint>

namespace kvtier::policy {

// Positions [0, kivi_quantised_end(...)) of a sequence of `length` tokens are stored quantised.
inline int64_t kivi_quantised_end(int64_t length, int64_t residual, int64_t key_group) {
  const int64_t out = length - residual;
  return out > 0 ? out / key_group * key_group : 0;
}

// f16 token blocks one (sequence, layer, head group) holds at most with KIVI, for passes of up to
// `max_new` tokens: before a pass fewer than residual + key_group positions are unquantised, the pass
// adds max_new, and a run of that many positions touches at most ceil((span - 1) / block) + 1 blocks.
// Never more than `max_blocks`.
inline int64_t kivi_f16_blocks(int64_t residual, int64_t key_group, int64_t max_new, int64_t block_tokens,
                               int64_t max_blocks) {
  const int64_t span = residual + key_group - 1 + max_new;
  const int64_t blocks = (span - 1 + block_tokens - 1) / block_tokens + 1;
  return blocks < max_blocks ? blocks : max_blocks;
}

}  // namespace kvtier::policy
