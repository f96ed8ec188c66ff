#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/dequant.h"
#include "backend/cpu/float_ops.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quantize_act.h"
#include "backend/cpu/weight_lanes.h"
#include "core/error.h"
#include "model/rope.h"

namespace kvtier::model {
namespace {

size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

}  // namespace

uint64_t ForwardBuffers::bytes() const {
  return 4 * uint64_t{x + xn + tmp + q + att + k + v + gate + up + cos + sin + q_pre + k_pre + hook_cos +
                      hook_sin} +
         matmul_bytes;
}

ForwardBuffers forward_buffers(const ModelConfig& cfg, const ModelWeights& w, int64_t max_tokens,
                               uint32_t kv_needs) {
  const size_t T = sz(max_tokens);
  const size_t hk = cfg.max_head_kv();
  const size_t tables = cfg.rope_tables.size();
  ForwardBuffers b;
  b.x = b.xn = b.tmp = T * cfg.n_embd;
  b.q = T * cfg.n_head * cfg.head_dim_k;
  b.att = T * cfg.n_head * cfg.head_dim_v;
  b.k = T * hk * cfg.head_dim_k;
  b.v = T * hk * cfg.head_dim_v;
  b.gate = T * cfg.n_ff;
  b.up = cfg.act == FfnActivation::kRelu ? 0 : T * cfg.n_ff;  // an ungated FFN (OPT) needs one buffer
  b.cos = b.sin = tables * T * (cfg.n_rot / 2);
  if (kv_needs & kv::kNeedPreRope) {
    b.q_pre = b.q;
    b.k_pre = b.k;
  }
  if (kv_needs != kv::kNeedNone) b.hook_cos = b.hook_sin = T * (cfg.n_rot / 2);
  auto need = [&](const cpu::WeightMatrix& m) {
    b.matmul_bytes = std::max(b.matmul_bytes, cpu::matmul_scratch_bytes(m.type, m.k, max_tokens));
  };
  need(w.output);
  for (const auto& L : w.layers) {
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) need(*m);
  }
  return b;
}

Forward::Forward(const ModelConfig& cfg, const ModelWeights& w, int64_t max_tokens, ThreadPool& pool,
                 cpu::Isa isa, kv::MemoryLedger& ledger, uint32_t kv_needs)
    : cfg_(cfg), w_(w), max_tokens_(max_tokens), pool_(pool), isa_(isa), kv_needs_(kv_needs) {
  KVTIER_ASSERT(max_tokens > 0);
  const ForwardBuffers b = forward_buffers(cfg, w, max_tokens, kv_needs);
  reservation_ = kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kActivations, b.bytes());
  x_.resize(b.x);
  xn_.resize(b.xn);
  q_.resize(b.q);
  k_.resize(b.k);
  v_.resize(b.v);
  att_.resize(b.att);
  tmp_.resize(b.tmp);
  gate_.resize(b.gate);
  up_.resize(b.up);
  cos_.resize(b.cos);
  sin_.resize(b.sin);
  q_pre_.resize(b.q_pre);
  k_pre_.resize(b.k_pre);
  hook_cos_.resize(b.hook_cos);
  hook_sin_.resize(b.hook_sin);
  mm_scratch_.resize(b.matmul_bytes);
  token_part_.resize(sz(max_tokens));
  logit_src_.resize(sz(max_tokens));
}

kv::KvGeometry kv_geometry(const ModelConfig& cfg, uint32_t block_tokens, cpu::KvDtype dtype,
                           uint32_t group_heads) {
  kv::KvGeometry g;
  for (const auto& l : cfg.layers) g.n_head_kv.push_back(l.n_head_kv);
  g.head_dim_k = cfg.head_dim_k;
  g.head_dim_v = cfg.head_dim_v;
  g.block_tokens = block_tokens;
  g.group_heads = group_heads;
  g.dtype = dtype;
  for (const auto& l : cfg.layers) g.window.push_back(l.window);
  return g;
}

kv::KvGeometry Forward::kv_geometry(uint32_t block_tokens, cpu::KvDtype dtype, uint32_t group_heads) const {
  return model::kv_geometry(cfg_, block_tokens, dtype, group_heads);
}

void Forward::matmul(const cpu::WeightMatrix& w, const float* x, int64_t n, float* y) {
  cpu::matmul(pool_, isa_, w, x, n, y, mm_scratch_);
}

void Forward::norm(const float* x, const float* w, const float* b, float* y) {
  if (cfg_.norm == NormKind::kLayer) {
    cpu::layer_norm(isa_, x, w, b, cfg_.rms_eps, cfg_.n_embd, y);
  } else {
    cpu::rms_norm(isa_, x, w, cfg_.rms_eps, cfg_.n_embd, y);
  }
}

void Forward::for_tokens(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n == 1 || pool_.size() == 1) {
    for (int64_t t = 0; t < n; ++t) fn(t);
    return;
  }
  const int parts = static_cast<int>(std::min<int64_t>(pool_.size(), n));
  pool_.run(parts, [&](int part) {
    const Range r = split_range(n, parts, part);
    for (int64_t t = r.begin; t < r.end; ++t) fn(t);
  });
}

void Forward::finish_q(const LayerWeights& L, float* q, const float* cos, const float* sin, float* pre) {
  const int64_t H = cfg_.n_head;
  const int64_t dk = cfg_.head_dim_k;
  if (L.bq != nullptr) cpu::add(isa_, q, L.bq, H * dk, q);
  if (cfg_.qk_norm) {
    for (int64_t h = 0; h < H; ++h)
      cpu::rms_norm(isa_, q + h * dk, L.attn_q_norm, cfg_.rms_eps, dk, q + h * dk);
  }
  if (pre != nullptr) std::copy(q, q + H * dk, pre);
  if (cfg_.n_rot > 0) cpu::rope(isa_, q, H, dk, cfg_.n_rot, cos, sin, cfg_.rope_mode);
}

void Forward::finish_kv(const LayerWeights& L, uint32_t l, float* k, float* v, const float* cos,
                        const float* sin, float* pre) {
  const int64_t hk = cfg_.layers[l].n_head_kv;
  const int64_t dk = cfg_.head_dim_k;
  const int64_t dv = cfg_.head_dim_v;
  if (L.bk != nullptr) cpu::add(isa_, k, L.bk, hk * dk, k);
  if (L.bv != nullptr) cpu::add(isa_, v, L.bv, hk * dv, v);
  if (cfg_.qk_norm) {
    for (int64_t h = 0; h < hk; ++h)
      cpu::rms_norm(isa_, k + h * dk, L.attn_k_norm, cfg_.rms_eps, dk, k + h * dk);
  }
  if (pre != nullptr) std::copy(k, k + hk * dk, pre);
  if (cfg_.n_rot > 0) cpu::rope(isa_, k, hk, dk, cfg_.n_rot, cos, sin, cfg_.rope_mode);
}

void Forward::project_kv(uint32_t l, const float* x, std::span<const int64_t> positions, float* k, float* v) {
  const auto n = static_cast<int64_t>(positions.size());
  KVTIER_ASSERT(kv_needs_ != kv::kNeedNone, "project_kv on a Forward built without KV needs");
  KVTIER_ASSERT(l < cfg_.n_layer && n > 0 && n <= max_tokens_, "project_kv of layer {} for {} rows", l, n);
  const LayerWeights& L = lw(l);
  const LayerConfig& lc = cfg_.layers[l];
  const int64_t half = cfg_.n_rot / 2;
  const cpu::MatmulOut kv_out[] = {{&L.wk, k}, {&L.wv, v}};
  cpu::matmul_same_input(pool_, isa_, kv_out, x, n, mm_scratch_);
  for_tokens(n, [&](int64_t t) {
    float* c = hook_cos_.data() + t * half;
    float* sn = hook_sin_.data() + t * half;
    rope_angles_ext(positions[sz(t)], cfg_.rope_tables[sz(lc.rope_table)], cfg_.n_rot, w_.rope_freqs, c, sn);
    finish_kv(L, l, k + t * lc.n_head_kv * cfg_.head_dim_k, v + t * lc.n_head_kv * cfg_.head_dim_v, c, sn,
              nullptr);
  });
}

std::vector<uint64_t> kv_input_row_bytes(const ModelConfig& cfg, const ModelWeights& w) {
  std::vector<uint64_t> out;
  for (uint32_t l = 0; l < cfg.n_layer; ++l) {
    const LayerWeights& L = w.layers[l];
    const bool shared = cpu::act_format_for(L.wk.type) == cpu::act_format_for(L.wv.type);
    out.push_back(shared ? cpu::act_row_bytes_for(L.wk.type, cfg.n_embd)
                         : static_cast<uint64_t>(cfg.n_embd) * sizeof(float));
  }
  return out;
}

void Forward::encode_inputs(uint32_t l, const float* x, int64_t n, uint8_t* out) {
  KVTIER_ASSERT(l < cfg_.n_layer && n > 0 && n <= max_tokens_, "encode_inputs of layer {} for {} rows", l, n);
  const LayerWeights& L = lw(l);
  if (cpu::act_format_for(L.wk.type) == cpu::act_format_for(L.wv.type)) {
    cpu::quantize_rows(pool_, isa_, L.wk.type, x, n, cfg_.n_embd, out);
  } else {  // the projections quantise differently: keep x itself
    std::memcpy(out, x, static_cast<size_t>(n * cfg_.n_embd) * sizeof(float));
  }
}

void Forward::project_kv_encoded(uint32_t l, const uint8_t* act, std::span<const int64_t> positions,
                                 uint32_t head0, uint32_t n_heads, float* k, float* v) {
  const auto n = static_cast<int64_t>(positions.size());
  KVTIER_ASSERT(kv_needs_ != kv::kNeedNone, "project_kv_encoded on a Forward built without KV needs");
  KVTIER_ASSERT(l < cfg_.n_layer && n > 0 && n <= max_tokens_, "project_kv_encoded of layer {} for {} rows",
                l, n);
  const LayerWeights& L = lw(l);
  const LayerConfig& lc = cfg_.layers[l];
  KVTIER_ASSERT(head0 + n_heads <= lc.n_head_kv, "heads {}+{} of {}", head0, n_heads, lc.n_head_kv);
  const int64_t dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  // The heads' rows of W_K and W_V: each output is its row's dot product, whatever the slice.
  const cpu::WeightMatrix wk = cpu::row_slice(L.wk, head0 * dk, n_heads * dk);
  const cpu::WeightMatrix wv = cpu::row_slice(L.wv, head0 * dv, n_heads * dv);
  if (cpu::act_format_for(L.wk.type) == cpu::act_format_for(L.wv.type)) {
    cpu::matmul_rows(pool_, isa_, wk, act, n, k);
    cpu::matmul_rows(pool_, isa_, wv, act, n, v);
  } else {
    matmul(wk, reinterpret_cast<const float*>(act), n, k);
    matmul(wv, reinterpret_cast<const float*>(act), n, v);
  }
  const int64_t half = cfg_.n_rot / 2;
  for_tokens(n, [&](int64_t t) {
    float* c = hook_cos_.data() + t * half;
    float* sn = hook_sin_.data() + t * half;
    rope_angles_ext(positions[sz(t)], cfg_.rope_tables[sz(lc.rope_table)], cfg_.n_rot, w_.rope_freqs, c, sn);
    finish_kv_heads(L, head0, n_heads, k + t * n_heads * dk, v + t * n_heads * dv, c, sn);
  });
}

void Forward::rope_q(uint32_t l, const float* q_pre, int64_t n, int64_t position, float* out) {
  KVTIER_ASSERT(kv_needs_ != kv::kNeedNone, "rope_q on a Forward built without KV needs");
  KVTIER_ASSERT(l < cfg_.n_layer && n > 0 && n <= max_tokens_, "rope_q of layer {} for {} rows", l, n);
  const LayerConfig& lc = cfg_.layers[l];
  const int64_t H = cfg_.n_head;
  const int64_t dk = cfg_.head_dim_k;
  float* c = hook_cos_.data();
  float* sn = hook_sin_.data();
  rope_angles_ext(position, cfg_.rope_tables[sz(lc.rope_table)], cfg_.n_rot, w_.rope_freqs, c, sn);
  for_tokens(n, [&](int64_t t) {
    float* q = out + t * H * dk;
    std::copy(q_pre + t * H * dk, q_pre + (t + 1) * H * dk, q);
    if (cfg_.n_rot > 0) cpu::rope(isa_, q, H, dk, cfg_.n_rot, c, sn, cfg_.rope_mode);
  });
}

void Forward::rope_k_rows(uint32_t l, const float* k_pre, std::span<const int64_t> positions, float* out) {
  const auto n = static_cast<int64_t>(positions.size());
  KVTIER_ASSERT(kv_needs_ != kv::kNeedNone, "rope_k_rows on a Forward built without KV needs");
  KVTIER_ASSERT(l < cfg_.n_layer && n > 0 && n <= max_tokens_, "rope_k_rows of layer {} for {} rows", l, n);
  const LayerConfig& lc = cfg_.layers[l];
  const int64_t dk = cfg_.head_dim_k;
  const int64_t half = cfg_.n_rot / 2;
  for_tokens(n, [&](int64_t t) {
    float* k = out + t * dk;
    std::copy(k_pre + t * dk, k_pre + (t + 1) * dk, k);
    if (cfg_.n_rot == 0) return;
    float* c = hook_cos_.data() + t * half;
    float* sn = hook_sin_.data() + t * half;
    rope_angles_ext(positions[sz(t)], cfg_.rope_tables[sz(lc.rope_table)], cfg_.n_rot, w_.rope_freqs, c, sn);
    cpu::rope(isa_, k, 1, dk, cfg_.n_rot, c, sn, cfg_.rope_mode);
  });
}

void Forward::project_q(uint32_t l, const float* x, std::span<const int64_t> positions, float* q) {
  const auto n = static_cast<int64_t>(positions.size());
  KVTIER_ASSERT(kv_needs_ != kv::kNeedNone, "project_q on a Forward built without KV needs");
  KVTIER_ASSERT(l < cfg_.n_layer && n > 0 && n <= max_tokens_, "project_q of layer {} for {} rows", l, n);
  const LayerWeights& L = lw(l);
  const LayerConfig& lc = cfg_.layers[l];
  const int64_t half = cfg_.n_rot / 2;
  matmul(L.wq, x, n, q);
  for_tokens(n, [&](int64_t t) {
    float* c = hook_cos_.data() + t * half;
    float* sn = hook_sin_.data() + t * half;
    rope_angles_ext(positions[sz(t)], cfg_.rope_tables[sz(lc.rope_table)], cfg_.n_rot, w_.rope_freqs, c, sn);
    finish_q(L, q + t * cfg_.n_head * cfg_.head_dim_k, c, sn, nullptr);
  });
}

void Forward::finish_kv_heads(const LayerWeights& L, uint32_t head0, uint32_t n_heads, float* k, float* v,
                              const float* cos, const float* sin) {
  const int64_t dk = cfg_.head_dim_k;
  const int64_t dv = cfg_.head_dim_v;
  const int64_t hk = n_heads;
  if (L.bk != nullptr) cpu::add(isa_, k, L.bk + head0 * dk, hk * dk, k);
  if (L.bv != nullptr) cpu::add(isa_, v, L.bv + head0 * dv, hk * dv, v);
  if (cfg_.qk_norm) {
    for (int64_t h = 0; h < hk; ++h)
      cpu::rms_norm(isa_, k + h * dk, L.attn_k_norm, cfg_.rms_eps, dk, k + h * dk);
  }
  if (cfg_.n_rot > 0) cpu::rope(isa_, k, hk, dk, cfg_.n_rot, cos, sin, cfg_.rope_mode);  // OPT: none
}

void Forward::layer(uint32_t l, int64_t n, kv::KvCache& kv) {
  const LayerWeights& L = stream_ != nullptr ? stream_->begin_layer(l) : w_.layers[l];
  const LayerConfig& lc = cfg_.layers[l];
  const int64_t E = cfg_.n_embd;
  const int64_t H = cfg_.n_head;
  const int64_t hk = lc.n_head_kv;
  const int64_t dk = cfg_.head_dim_k;
  const int64_t dv = cfg_.head_dim_v;
  const int64_t half = cfg_.n_rot / 2;
  const int64_t T = max_tokens_;
  const float eps = cfg_.rms_eps;
  const bool pre_rope = (kv_needs_ & kv::kNeedPreRope) != 0;

  // Attention block.
  for_tokens(n, [&](int64_t t) { norm(x_.data() + t * E, L.attn_norm, L.attn_norm_b, xn_.data() + t * E); });
  const cpu::MatmulOut qkv[] = {{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}};
  cpu::matmul_same_input(pool_, isa_, qkv, xn_.data(), n, mm_scratch_);
  const float* cos = cos_.data() + lc.rope_table * T * half;
  const float* sin = sin_.data() + lc.rope_table * T * half;
  for_tokens(n, [&](int64_t t) {
    finish_q(L, q_.data() + t * H * dk, cos + t * half, sin + t * half,
             pre_rope ? q_pre_.data() + t * H * dk : nullptr);
    finish_kv(L, l, k_.data() + t * hk * dk, v_.data() + t * hk * dv, cos + t * half, sin + t * half,
              pre_rope ? k_pre_.data() + t * hk * dk : nullptr);
  });
  kv::LayerRows rows;
  rows.k = k_.data();
  rows.v = v_.data();
  if (kv_needs_ & kv::kNeedLayerInput) rows.x = xn_.data();
  if (pre_rope) {
    rows.q_pre = q_pre_.data();
    rows.k_pre = k_pre_.data();
  }
  kv.write(l, rows);
  kv.attend(l, q_.data(), H, {cfg_.attn_scale, cfg_.attn_softcap, lc.window}, att_.data());
  matmul(L.wo, att_.data(), n, tmp_.data());
  if (stream_ != nullptr) stream_->ffn_ready(l);  // the FFN side (and its norm) of a streamed layer
  for_tokens(n, [&](int64_t t) {
    float* a = tmp_.data() + t * E;
    if (L.bo != nullptr) cpu::add(isa_, a, L.bo, E, a);
    if (L.post_attn_norm != nullptr) cpu::rms_norm(isa_, a, L.post_attn_norm, eps, E, a);
    float* x = x_.data() + t * E;
    cpu::add(isa_, x, a, E, x);
    norm(x, L.ffn_norm, L.ffn_norm_b, xn_.data() + t * E);
  });

  // Feed-forward block: act(gate) * up (OPT: relu(up + b_up)) in gate_, then down.
  const int64_t F = cfg_.n_ff;
  if (cfg_.act == FfnActivation::kRelu) {
    matmul(L.up, xn_.data(), n, gate_.data());
    for_tokens(n, [&](int64_t t) {
      float* g = gate_.data() + t * F;
      if (L.b_up != nullptr) cpu::add(isa_, g, L.b_up, F, g);
      cpu::relu(isa_, g, F, g);
    });
  } else {
    const cpu::MatmulOut gate_up[] = {{&L.gate, gate_.data()}, {&L.up, up_.data()}};
    cpu::matmul_same_input(pool_, isa_, gate_up, xn_.data(), n, mm_scratch_);
    for_tokens(n, [&](int64_t t) {
      float* g = gate_.data() + t * F;
      if (cfg_.act == FfnActivation::kSilu) {
        cpu::silu(isa_, g, F, g);
      } else {
        cpu::gelu_tanh(isa_, g, F, g);
      }
      cpu::mul(isa_, g, up_.data() + t * F, F, g);
    });
  }
  matmul(L.down, gate_.data(), n, tmp_.data());
  for_tokens(n, [&](int64_t t) {
    float* f = tmp_.data() + t * E;
    if (L.b_down != nullptr) cpu::add(isa_, f, L.b_down, E, f);
    if (L.post_ffn_norm != nullptr) cpu::rms_norm(isa_, f, L.post_ffn_norm, eps, E, f);
    cpu::add(isa_, x_.data() + t * E, f, E, x_.data() + t * E);
  });
}

int64_t logit_rows(const SeqTokens& s) {
  switch (s.rows) {
    case LogitRows::kNone:
      return 0;
    case LogitRows::kLast:
      return 1;
    case LogitRows::kAll:
      return static_cast<int64_t>(s.tokens.size());
    case LogitRows::kStates:
      return 0;
  }
  return 0;
}

void Forward::run(std::span<const TokenId> tokens, kv::SeqId seq, kv::KvCache& kv, LogitRows rows,
                  float* logits) {
  const SeqTokens part{seq, tokens, rows};
  run_batch({&part, 1}, kv, logits);
}

void Forward::run_batch(std::span<const SeqTokens> parts, kv::KvCache& kv, float* logits) {
  int64_t n = 0;
  for (const SeqTokens& p : parts) n += static_cast<int64_t>(p.tokens.size());
  KVTIER_ASSERT(!parts.empty() && n > 0 && n <= max_tokens_, "{} tokens for a forward pass of at most {}", n,
                max_tokens_);
  KVTIER_ASSERT((kv.needs() & ~kv_needs_) == 0, "the KV cache needs rows {:#x}; this Forward makes {:#x}",
                kv.needs(), kv_needs_);
  const int64_t E = cfg_.n_embd;
  const auto row_bytes = static_cast<int64_t>(*ggml_row_bytes(w_.tok_embd.type, static_cast<uint64_t>(E)));
  KVTIER_ASSERT(w_.tok_embd.lanes == nullptr || row_bytes <= E * static_cast<int64_t>(sizeof(float)),
                "an embedding row of {} bytes does not fit a scratch row of {} floats", row_bytes, E);
  const int64_t pos_row_bytes =
      cfg_.learned_pos ? static_cast<int64_t>(*ggml_row_bytes(w_.pos_embd.type, static_cast<uint64_t>(E)))
                       : 0;
  batch_.clear();
  part_row0_.clear();
  int64_t row = 0;
  for (const SeqTokens& p : parts) {
    KVTIER_ASSERT(!p.tokens.empty(), "a part of sequence {} with no tokens", p.seq);
    for (TokenId id : p.tokens) {
      if (id < 0 || static_cast<uint32_t>(id) >= cfg_.n_vocab)
        fail(ErrorKind::kInvalidArgument, "token id {} is outside the vocabulary of {}", id, cfg_.n_vocab);
    }
    part_row0_.push_back(row);
    for (size_t t = 0; t < p.tokens.size(); ++t) token_part_[sz(row++)] = static_cast<int64_t>(batch_.size());
    batch_.push_back({p.seq, static_cast<int64_t>(p.tokens.size()), p.tokens});
  }
  const std::span<const kv::PassPositions> pp = kv.begin_batch(batch_);
  try {
    if (cfg_.learned_pos) {
      for (const kv::PassPositions& p : pp) {
        if (p.n > 0 && p.position(p.n - 1) >= cfg_.n_ctx_train)
          fail(ErrorKind::kInvalidArgument, "position {} is beyond the {} learned positions of this model",
               p.position(p.n - 1), cfg_.n_ctx_train);
      }
    }
    // Embeddings and RoPE angles of the pass's positions (token t of the pass is token t - row0 of
    // its part).
    const int64_t half = cfg_.n_rot / 2;
    for_tokens(n, [&](int64_t t) {
      const auto b = sz(token_part_[sz(t)]);
      const int64_t i = t - part_row0_[b];
      float* x = x_.data() + t * E;
      const TokenId tok = parts[b].tokens[sz(i)];
      const uint8_t* row = w_.tok_embd.data + tok * row_bytes;
      if (w_.tok_embd.lanes != nullptr) {  // a tied embedding: its row from the output's lanes copy
        auto* bytes = reinterpret_cast<uint8_t*>(tmp_.data() + t * E);  // [row_bytes] of tmp_'s row t
        cpu::unpack_lanes_row(w_.tok_embd, tok, bytes);
        row = bytes;
      }
      cpu::dequantize_row(w_.tok_embd.type, row, x, E);
      if (cfg_.embd_scale != 1.0f) {
        for (int64_t e = 0; e < E; ++e) x[e] *= cfg_.embd_scale;
      }
      if (cfg_.learned_pos) {  // OPT: + the learned embedding of the token's position
        const int64_t pos = pp[b].position(i);
        float* pe = tmp_.data() + t * E;
        cpu::dequantize_row(w_.pos_embd.type, w_.pos_embd.data + pos * pos_row_bytes, pe, E);
        cpu::add(isa_, x, pe, E, x);
      }
      for (size_t r = 0; r < cfg_.rope_tables.size(); ++r) {
        const int64_t off = (static_cast<int64_t>(r) * max_tokens_ + t) * half;
        rope_angles_ext(pp[b].position(i), cfg_.rope_tables[r], cfg_.n_rot, w_.rope_freqs, cos_.data() + off,
                        sin_.data() + off);
      }
    });
    for (uint32_t l = 0; l < cfg_.n_layer; ++l) layer(l, n, kv);
    kv.end_pass();
  } catch (...) {
    kv.abort_pass();
    throw;
  }

  // The logit rows the parts want, gathered in order, through the output norm.
  states_rows_ = 0;
  if (parts[0].rows == LogitRows::kStates) {
    KVTIER_ASSERT(parts.size() == 1, "states of a pass of {} parts (one only)", parts.size());
    for_tokens(
        n, [&](int64_t t) { norm(x_.data() + t * E, w_.output_norm, w_.output_norm_b, xn_.data() + t * E); });
    states_rows_ = n;
    return;
  }
  int64_t m = 0;
  int64_t part_row = 0;
  for (const SeqTokens& p : parts) {
    KVTIER_ASSERT(p.rows != LogitRows::kStates, "states of a pass of {} parts (one only)", parts.size());
    const int64_t np = static_cast<int64_t>(p.tokens.size());
    const int64_t want = logit_rows(p);
    const int64_t first = part_row + np - want;
    for (int64_t t = 0; t < want; ++t) logit_src_[sz(m++)] = first + t;
    part_row += np;
  }
  if (m == 0) return;
  for_tokens(m, [&](int64_t t) {
    norm(x_.data() + logit_src_[sz(t)] * E, w_.output_norm, w_.output_norm_b, xn_.data() + t * E);
  });
  output(xn_.data(), m, logits);
}

void Forward::output(const float* states, int64_t m, float* logits) {
  matmul(w_.output, states, m, logits);
  if (cfg_.final_softcap > 0.0f) {
    const float c = cfg_.final_softcap;
    const int64_t V = cfg_.n_vocab;
    for_tokens(m, [&](int64_t t) {
      float* lg = logits + t * V;
      for (int64_t i = 0; i < V; ++i) lg[i] = c * std::tanh(lg[i] / c);
    });
  }
}

}  // namespace kvtier::model
