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

// StreamingLLM (retention `streaming`) on a layer without a window of its own: the first `sinks`
// positions and the last `window` positions up to the query are kept. A query at position t whose
// window reaches back over the sinks (t <= sinks + window - 1) has lost nothing: it attends every key
// normally. A later query attends its window [t - window + 1, t] normally and the sinks as if they sat
// just before the window (positions within the cache, as the paper places them): since RoPE scores
// depend on the distance only, that is the query rotated to position sinks + window - 1 against the
// sinks at their own positions.

// Queries of a pass at [pos0, pos0 + n) that attend normally: the first streaming_plain_queries(...).
inline int64_t streaming_plain_queries(int64_t pos0, int64_t n, int64_t sinks, int64_t window) {
  const int64_t last_plain = sinks + window - 1;  // the last position that lost nothing
  const int64_t k = last_plain + 1 - pos0;
  return k <= 0 ? 0 : (k < n ? k : n);
}
// The position a query is rotated to when it attends the sinks.
inline int64_t streaming_sink_position(int64_t sinks, int64_t window) {
  return sinks + window - 1;
}
// Blocks that hold a sink (never freed).
inline int64_t streaming_sink_blocks(int64_t sinks, int64_t block_tokens) {
  return (sinks + block_tokens - 1) / block_tokens;
}
// Token blocks [first, last) that no query at `next_pos` or later can see (to be freed): wholly
// above the sinks and wholly below the next query's window. Empty (first >= last) while the next
// query still attends everything.
struct BlockRange {
  int64_t first = 0;
  int64_t last = 0;
};
inline BlockRange streaming_free_blocks(int64_t next_pos, int64_t sinks, int64_t window,
                                        int64_t block_tokens) {
  if (next_pos <= sinks + window - 1) return {};
  return {streaming_sink_blocks(sinks, block_tokens), sliding_first_visible(next_pos, window) / block_tokens};
}
// Token blocks one (sequence, layer) holds at most under streaming for passes of up to `max_new`
// tokens: the sink blocks and the window's (sliding_blocks), never more than `max_blocks`.
inline int64_t streaming_blocks(int64_t sinks, int64_t window, int64_t max_new, int64_t block_tokens,
                                int64_t max_blocks) {
  const int64_t b =
      streaming_sink_blocks(sinks, block_tokens) + sliding_blocks(window, max_new, block_tokens, max_blocks);
  return b < max_blocks ? b : max_blocks;
}

}  // namespace kvtier::policy
