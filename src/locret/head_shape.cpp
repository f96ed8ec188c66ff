#include "locret/head_shape.h"

#include <cstring>

#include "core/error.h"

namespace kvtier::locret {

const char* activation_name(HeadActivation a) {
  switch (a) {
    case HeadActivation::kSilu:
      return "silu";
    case HeadActivation::kGeluTanh:
      return "gelu_tanh";
    case HeadActivation::kRelu:
      return "relu";
  }
  return "?";
}

HeadActivation activation_from_name(const char* name) {
  if (std::strcmp(name, "silu") == 0) return HeadActivation::kSilu;
  if (std::strcmp(name, "gelu_tanh") == 0) return HeadActivation::kGeluTanh;
  if (std::strcmp(name, "relu") == 0) return HeadActivation::kRelu;
  fail(ErrorKind::kInvalidFile, "unknown retaining-head activation '{}' (expected silu, gelu_tanh or relu)",
       name);
}

uint64_t HeadShapes::parameters(uint32_t l) const {
  const LayerShape& s = layers.at(l);
  return static_cast<uint64_t>(s.d_in() * d_m + d_m * s.n_head_kv);
}

uint64_t HeadShapes::parameters() const {
  uint64_t n = 0;
  for (uint32_t l = 0; l < n_layer(); ++l) n += parameters(l);
  return n;
}

HeadShapes head_shapes(const model::ModelConfig& cfg, int64_t d_m) {
  if (d_m <= 0)
    fail(ErrorKind::kInvalidArgument, "retaining-head intermediate size must be positive, not {}", d_m);
  HeadShapes s;
  s.d_m = d_m;
  switch (cfg.act) {
    case model::FfnActivation::kSilu:
      s.act = HeadActivation::kSilu;
      break;
    case model::FfnActivation::kGeluTanh:
      s.act = HeadActivation::kGeluTanh;
      break;
    case model::FfnActivation::kRelu:
      s.act = HeadActivation::kRelu;
      break;
  }
  for (const auto& l : cfg.layers) {
    s.layers.push_back({cfg.n_head, l.n_head_kv, cfg.head_dim_k, cfg.head_dim_v});
  }
  return s;
}

HeadShapes head_shapes(uint32_t n_layer, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t d_m,
                       HeadActivation act) {
  HeadShapes s;
  s.d_m = d_m;
  s.act = act;
  s.layers.assign(n_layer, LayerShape{n_head, n_head_kv, head_dim, head_dim});
  return s;
}

}  // namespace kvtier::locret
