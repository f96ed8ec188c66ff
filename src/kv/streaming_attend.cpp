#include "kv/streaming_attend.h"

#include "core/error.h"
#include "policy/retention.h"

namespace kvtier::kv {

StreamingBuffers::StreamingBuffers(int64_t max_new, int64_t heads, int64_t head_dim_k, int64_t head_dim_v,
                                   int64_t sink_blocks, int64_t max_blocks)
    : n_head(heads),
      q_sink(static_cast<size_t>(max_new * heads * head_dim_k)),
      o_sink(static_cast<size_t>(max_new * heads * head_dim_v)),
      lse_window(static_cast<size_t>(max_new * heads)),
      lse_sink(static_cast<size_t>(max_new * heads)),
      sink_spans(static_cast<size_t>(sink_blocks)),
      spans(static_cast<size_t>(max_blocks)) {}

uint64_t StreamingBuffers::bytes(int64_t max_new, int64_t heads, int64_t head_dim_k, int64_t head_dim_v,
                                 int64_t sink_blocks, int64_t max_blocks) {
  const auto rows = static_cast<uint64_t>(max_new * heads);
  return rows * sizeof(float) * static_cast<uint64_t>(head_dim_k + head_dim_v + 2) +
         static_cast<uint64_t>(sink_blocks + max_blocks) * sizeof(cpu::KvSpan);
}

void attend_streaming(ThreadPool& pool, cpu::Isa isa, const cpu::AttnParams& ap, int64_t sinks,
                      int64_t window, const cpu::AttnQueries& q, const float* q_sink, int64_t head0,
                      std::span<const cpu::KvSpan> spans, const cpu::AttnOutput& out, StreamingBuffers& buf,
                      std::span<uint8_t> scratch) {
  KVTIER_ASSERT(ap.window == 0, "streaming attention on a layer with a window of its own");
  KVTIER_ASSERT(head0 + q.n_heads <= buf.n_head, "query heads [{}, {}) of {}", head0, head0 + q.n_heads,
                buf.n_head);
  const int64_t n_plain = policy::streaming_plain_queries(q.pos0, q.n_tokens, sinks, window);
  if (n_plain > 0) {
    cpu::AttnQueries qp = q;
    qp.n_tokens = n_plain;
    cpu::attend(pool, isa, ap, qp, spans, out, scratch);
  }
  const int64_t rest = q.n_tokens - n_plain;
  if (rest == 0) return;
  KVTIER_ASSERT(q_sink != nullptr, "streaming attention without the queries at the sink position");
  const int64_t dv = ap.head_dim_v;
  const int64_t ls = buf.n_head;  // lse stride between tokens
  // The recent window, every key older than it masked (the sinks included).
  cpu::AttnParams aw = ap;
  aw.window = window;
  cpu::AttnQueries qw = q;
  qw.q += n_plain * q.token_stride;
  qw.n_tokens = rest;
  qw.pos0 = q.pos0 + n_plain;
  cpu::AttnOutput ow{out.o + n_plain * out.token_stride, out.token_stride,
                     buf.lse_window.data() + n_plain * ls + head0, ls};
  cpu::attend(pool, isa, aw, qw, spans, ow, scratch);
  if (sinks == 0) return;  // window attention only
  // The sinks: the stored rows below `sinks` (all of them visible to these queries).
  size_t n_sink = 0;
  for (const cpu::KvSpan& sp : spans) {
    if (sp.pos0 >= sinks) break;
    KVTIER_ASSERT(n_sink < buf.sink_spans.size(), "more than {} sink spans", buf.sink_spans.size());
    cpu::KvSpan c = sp;
    c.n_tokens = std::min(sp.n_tokens, sinks - sp.pos0);
    buf.sink_spans[n_sink++] = c;
  }
  cpu::AttnQueries qs = qw;
  qs.q = q_sink + n_plain * q.token_stride;
  cpu::AttnOutput os{buf.o_sink.data() + n_plain * out.token_stride + head0 * dv, out.token_stride,
                     buf.lse_sink.data() + n_plain * ls + head0, ls};
  cpu::attend(pool, isa, ap, qs, std::span(buf.sink_spans.data(), n_sink), os, scratch);
  for (int64_t t = 0; t < rest; ++t) {
    cpu::merge_attention(ow.o + t * out.token_stride, ow.lse + t * ls, os.o + t * out.token_stride,
                         os.lse + t * ls, q.n_heads, dv);
  }
}

}  // namespace kvtier::kv
