// StreamingLLM's attention over one layer's stored rows (retention `streaming`; which rows are kept is
// decided in policy/retention.h). Each query of a pass attends either
//   * normally, while its window still reaches back over the sinks (nothing it sees was dropped), or
//   * its recent window [t - window + 1, t] normally, plus the sinks [0, sinks) with the query rotated
//     to position sinks + window - 1 (the sinks sit just before the window: positions within the
//     cache), the two partial results merged by log-sum-exp.
// The first case hands the backend the very spans and queries a policy without retention would (same
// bits), so streaming whose window covers the context is bit-identical to no retention.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/attention.h"
#include "core/thread_pool.h"

namespace kvtier::kv {

// The buffers of attend_streaming for passes of up to max_new tokens of n_head query heads.
struct StreamingBuffers {
  StreamingBuffers() = default;
  // max_blocks: token blocks of a sequence's layer (the spans a placement may build into `spans`).
  StreamingBuffers(int64_t max_new, int64_t n_head, int64_t head_dim_k, int64_t head_dim_v,
                   int64_t sink_blocks, int64_t max_blocks);
  static uint64_t bytes(int64_t max_new, int64_t n_head, int64_t head_dim_k, int64_t head_dim_v,
                        int64_t sink_blocks, int64_t max_blocks);

  int64_t n_head = 0;
  std::vector<float> q_sink;            // [max_new, n_head, head_dim_k] f32: queries at the sink position
  std::vector<float> o_sink;            // [max_new, n_head, head_dim_v] f32: attention over the sinks
  std::vector<float> lse_window;        // [max_new, n_head] f32
  std::vector<float> lse_sink;          // [max_new, n_head] f32
  std::vector<cpu::KvSpan> sink_spans;  // [sink_blocks] the spans clipped to the sinks
  std::vector<cpu::KvSpan> spans;       // [max_blocks] the stored runs of a layer (offloaded placements)
};

// Attention of the queries `q` (query heads [head0, head0 + q.n_heads) of the layer) over `spans`, the
// stored rows in position order (the rows retention dropped are not in them). q_sink holds the same
// queries rotated to policy::streaming_sink_position (token t at q_sink + t * q.token_stride, set for
// the tokens that attend the sinks). ap.window must be 0 (a layer with a window of its own keeps it,
// without sinks).
void attend_streaming(ThreadPool& pool, cpu::Isa isa, const cpu::AttnParams& ap, int64_t sinks,
                      int64_t window, const cpu::AttnQueries& q, const float* q_sink, int64_t head0,
                      std::span<const cpu::KvSpan> spans, const cpu::AttnOutput& out, StreamingBuffers& buf,
                      std::span<uint8_t> scratch);

}  // namespace kvtier::kv
