#include "policy/memory_model.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace kvtier::policy {
namespace {

constexpr Method kMethods[] = {Method::kStandard, Method::kChunked, Method::kKvQuant4, Method::kLayer,
                               Method::kHeadInfer};

struct Linear {  // device bytes = fixed + per_token * S ; host bytes = host_per_token * S
  uint64_t fixed = 0;
  uint64_t per_token = 0;
  uint64_t host_per_token = 0;
};

uint64_t act_per_token(const ModelShape& m, uint32_t b) {
  return (uint64_t{m.n_embd} + 2ull * m.n_ff) * b;
}

// Ping-pong pair for g heads: 2 buffers x (K, V) x g x d_h x b per token.
uint64_t pingpong_per_token(const ModelShape& m, uint32_t g, uint32_t b) {
  return 4ull * g * m.head_dim * b;
}

Linear linear_model(const ModelShape& m, Method method, const PlanInputs& in, uint32_t g) {
  const uint64_t kv_tok = kv_bytes_per_token(m, in.kv_elem_bytes);
  const uint64_t act_tok = act_per_token(m, in.act_elem_bytes);
  Linear l;
  l.fixed = m.weight_bytes;
  switch (method) {
    case Method::kStandard:
      l.per_token = kv_tok + act_tok;
      break;
    case Method::kChunked:
      l.fixed += in.chunk * act_tok;
      l.per_token = kv_tok;
      break;
    case Method::kKvQuant4:
      l.per_token = kv_tok / 4 + act_tok;
      break;
    case Method::kLayer:
      l.per_token = 2 * (kv_tok / m.n_layer) + act_tok;
      l.host_per_token = kv_tok;
      break;
    case Method::kHeadInfer:
      l.fixed += in.chunk * act_tok;
      l.per_token = pingpong_per_token(m, g, in.kv_elem_bytes);
      l.host_per_token = kv_tok;
      break;
  }
  return l;
}

bool divides(uint32_t g, uint32_t n) {
  return g > 0 && n % g == 0;
}

}  // namespace

std::string_view method_name(Method m) {
  switch (m) {
    case Method::kStandard:
      return "standard";
    case Method::kChunked:
      return "chunked";
    case Method::kKvQuant4:
      return "kvquant4";
    case Method::kLayer:
      return "layer";
    case Method::kHeadInfer:
      return "headinfer";
  }
  return "?";
}

std::optional<Method> method_from_name(std::string_view name) {
  for (Method m : kMethods) {
    if (method_name(m) == name) return m;
  }
  return std::nullopt;
}

std::span<const Method> all_methods() {
  return kMethods;
}

uint64_t kv_bytes_per_token(const ModelShape& m, uint32_t elem_bytes) {
  return 2ull * m.n_layer * m.n_head_kv * m.head_dim * elem_bytes;
}

uint32_t adaptive_group(const ModelShape& m, uint64_t n_ctx, uint32_t b, uint64_t pingpong_budget) {
  for (uint32_t g = m.n_head_kv; g >= 1; --g) {
    if (divides(g, m.n_head_kv) && pingpong_per_token(m, g, b) * n_ctx <= pingpong_budget) return g;
  }
  return 0;
}

MemoryPlan plan_memory(const ModelShape& m, Method method, const PlanInputs& in) {
  if (m.n_layer == 0 || m.n_head_kv == 0 || m.head_dim == 0) {
    fail(ErrorKind::kInvalidArgument, "model shape needs layers, KV heads and head dimension");
  }
  if (in.group != 0 && !divides(in.group, m.n_head_kv)) {
    fail(ErrorKind::kInvalidArgument, "group size {} does not divide the {} KV heads", in.group, m.n_head_kv);
  }
  MemoryPlan p;
  p.method = method;
  const uint64_t S = in.n_ctx;
  const uint64_t kv_tok = kv_bytes_per_token(m, in.kv_elem_bytes);
  const uint64_t act_tok = act_per_token(m, in.act_elem_bytes);
  const uint64_t act_chunk = std::min(S, in.chunk) * act_tok;
  p.device_weights = m.weight_bytes;
  p.total_kv = S * kv_tok;
  switch (method) {
    case Method::kStandard:
      p.device_kv = S * kv_tok;
      p.device_activations = S * act_tok;
      break;
    case Method::kChunked:
      p.device_kv = S * kv_tok;
      p.device_activations = act_chunk;
      break;
    case Method::kKvQuant4:
      p.device_kv = S * kv_tok / 4;
      p.total_kv = p.device_kv;
      p.device_activations = S * act_tok;
      break;
    case Method::kLayer:
      p.device_kv = 2 * S * (kv_tok / m.n_layer);
      p.device_activations = S * act_tok;
      p.host_kv = S * kv_tok;
      break;
    case Method::kHeadInfer: {
      uint32_t g = in.group;
      if (g == 0) {
        const uint64_t fixed = m.weight_bytes + act_chunk;
        const uint64_t room = in.device_budget == 0      ? std::numeric_limits<uint64_t>::max()
                              : in.device_budget > fixed ? in.device_budget - fixed
                                                         : 0;
        g = adaptive_group(m, S, in.kv_elem_bytes, room);
        if (g == 0) g = 1;  // nothing fits; report the smallest footprint (fits = false below)
      }
      p.group = g;
      p.device_kv = S * pingpong_per_token(m, g, in.kv_elem_bytes);
      p.device_activations = act_chunk;
      p.host_kv = S * kv_tok;
      break;
    }
  }
  p.fits = (in.device_budget == 0 || p.device_total() <= in.device_budget) &&
           (in.host_budget == 0 || p.host_kv <= in.host_budget);
  return p;
}

uint64_t max_context(const ModelShape& m, Method method, const PlanInputs& in) {
  constexpr uint64_t kUnbounded = uint64_t{1} << 40;
  auto solve = [&](uint32_t g) {
    const Linear l = linear_model(m, method, in, g);
    uint64_t s = kUnbounded;
    if (in.device_budget != 0) {
      if (in.device_budget < l.fixed) return uint64_t{0};
      s = std::min(s, l.per_token ? (in.device_budget - l.fixed) / l.per_token : kUnbounded);
    }
    if (in.host_budget != 0 && l.host_per_token != 0) s = std::min(s, in.host_budget / l.host_per_token);
    return s;
  };
  // Chunked methods hold activations for min(S, C) tokens: below one chunk they grow per token.
  const bool chunked = method == Method::kChunked || method == Method::kHeadInfer;
  auto best_for = [&](uint32_t g) {
    uint64_t s = solve(g);
    if (chunked && s < in.chunk) {
      // Within the first chunk the activations scale with S: the standard-like line applies.
      PlanInputs small = in;
      small.chunk = 0;
      const Linear l = linear_model(m, method, small, g);
      const uint64_t act_tok = act_per_token(m, in.act_elem_bytes);
      uint64_t t = kUnbounded;
      if (in.device_budget != 0) {
        t = in.device_budget < l.fixed ? 0 : (in.device_budget - l.fixed) / (l.per_token + act_tok);
      }
      if (in.host_budget != 0 && l.host_per_token != 0) t = std::min(t, in.host_budget / l.host_per_token);
      s = std::min(t, in.chunk);
    }
    return s;
  };
  if (method != Method::kHeadInfer) return best_for(0);
  if (in.group != 0) return best_for(in.group);
  uint64_t best = 0;
  for (uint32_t g = 1; g <= m.n_head_kv; ++g) {
    if (divides(g, m.n_head_kv)) best = std::max(best, best_for(g));
  }
  return best;
}

}  // namespace kvtier::policy
