// Pure retention decisions (plan, then the kv layer frees): which positions of a layer no later query
// can see, and how many blocks a layer then needs at most.
#pragma once

#include <cstdint>

namespace kvtier::policy {

// First key position that a query at position `next_pos` or later can see in a layer with a sliding
// window of `window` keys (key visible iff q_pos - k_pos < window); 0 for a global layer (window 0).
inline int64_t sliding_first_visible(int64_t next_pos, int64_t window) {
  if (window <= 0) return 0;
  const int64_t first = next_pos - window + 1;
  return first > 0 ? first : 0;
}

// First token block a query at `next_pos` or later can see (blocks below it may be freed).
inline int64_t sliding_first_block(int64_t next_pos, int64_t window, int64_t block_tokens) {
  return sliding_first_visible(next_pos, window) / block_tokens;
}

// Token blocks of one (sequence, layer, head group) that sliding retention holds at most, for passes
// of up to `max_new` tokens: the positions [first visible to the pass's first query, pass end) span
// window - 1 + max_new positions, which touch at most ceil((span - 1) / block) + 1 blocks. Never more
// than `max_blocks` (the whole context); a global layer (window 0) needs them all.
inline int64_t sliding_blocks(int64_t window, int64_t max_new, int64_t block_tokens, int64_t max_blocks) {
  if (window <= 0) return max_blocks;
  const int64_t span = window - 1 + max_new;
  const int64_t blocks = (span - 1 + block_tokens - 1) / block_tokens + 1;
  return blocks < max_blocks ? blocks : max_blocks;
}

}  // namespace kvtier::policy
