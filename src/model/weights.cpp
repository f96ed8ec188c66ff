#include "model/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "backend/cpu/dequant.h"
#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace kvtier::model {
namespace {

class Loader {
 public:
  Loader(const gguf::File& f, ModelWeights& w) : f_(f), w_(w) {}

  const gguf::TensorInfo& find(const std::string& name, std::vector<uint64_t> ne) {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (t == nullptr) fail(ErrorKind::kInvalidFile, "{}: tensor '{}' is missing", f_.path(), name);
    if (t->ne != ne) {
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has shape [{}], expected [{}]", f_.path(), name,
           fmt::join(t->ne, ", "), fmt::join(ne, ", "));
    }
    w_.bytes += t->n_bytes;
    return *t;
  }

  const float* vec(const std::string& name, uint64_t n) {
    const gguf::TensorInfo& t = find(name, {n});
    if (t.type != GgmlType::kF32) {
      fail(ErrorKind::kUnsupported, "{}: tensor '{}' is {}; norm and bias vectors must be f32", f_.path(),
           name, ggml_type_name(t.type));
    }
    return reinterpret_cast<const float*>(t.data);
  }

  const float* opt_vec(const std::string& name, uint64_t n) {
    return f_.find_tensor(name) != nullptr ? vec(name, n) : nullptr;
  }

  // A GGUF matrix of ne = [k, n_rows]: n_rows rows of k elements.
  cpu::WeightMatrix mat(const std::string& name, uint64_t n_rows, uint64_t k) {
    const gguf::TensorInfo& t = find(name, {k, n_rows});
    if (!cpu::is_supported_weight_type(t.type)) {
      fail(ErrorKind::kUnsupported, "{}: tensor '{}' has type {}, which the CPU kernels do not support",
           f_.path(), name, ggml_type_name(t.type));
    }
    return {t.type, t.data, static_cast<int64_t>(n_rows), static_cast<int64_t>(k)};
  }

 private:
  const gguf::File& f_;
  ModelWeights& w_;
};

}  // namespace

ModelWeights load_weights(const gguf::File& file, const ModelConfig& c) {
  ModelWeights w;
  Loader ld(file, w);
  const uint64_t E = c.n_embd;
  w.tok_embd = ld.mat("token_embd.weight", c.n_vocab, E);
  w.output_norm = ld.vec("output_norm.weight", E);
  const bool layer_norm = c.norm == NormKind::kLayer;
  if (layer_norm) w.output_norm_b = ld.vec("output_norm.bias", E);
  if (c.learned_pos) w.pos_embd = ld.mat("position_embd.weight", c.n_ctx_train, E);
  if (file.find_tensor("output.weight") != nullptr) {
    w.output = ld.mat("output.weight", c.n_vocab, E);
  } else {
    w.output = w.tok_embd;
    w.tied_output = true;
  }
  w.rope_freqs = ld.opt_vec("rope_freqs.weight", c.n_rot / 2);
  w.layers.resize(c.n_layer);
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers[l];
    const std::string p = fmt::format("blk.{}.", l);
    const uint64_t hk = c.layers[l].n_head_kv;
    const uint64_t q_rows = uint64_t{c.n_head} * c.head_dim_k;
    const uint64_t k_rows = hk * c.head_dim_k;
    const uint64_t v_rows = hk * c.head_dim_v;
    L.attn_norm = ld.vec(p + "attn_norm.weight", E);
    L.ffn_norm = ld.vec(p + "ffn_norm.weight", E);
    L.wq = ld.mat(p + "attn_q.weight", q_rows, E);
    L.wk = ld.mat(p + "attn_k.weight", k_rows, E);
    L.wv = ld.mat(p + "attn_v.weight", v_rows, E);
    L.wo = ld.mat(p + "attn_output.weight", E, uint64_t{c.n_head} * c.head_dim_v);
    if (c.act != FfnActivation::kRelu) L.gate = ld.mat(p + "ffn_gate.weight", c.n_ff, E);
    L.up = ld.mat(p + "ffn_up.weight", c.n_ff, E);
    L.down = ld.mat(p + "ffn_down.weight", E, c.n_ff);
    if (c.qkv_bias) {
      L.bq = ld.vec(p + "attn_q.bias", q_rows);
      L.bk = ld.vec(p + "attn_k.bias", k_rows);
      L.bv = ld.vec(p + "attn_v.bias", v_rows);
    } else {  // some llama-family files carry biases: use them when present
      L.bq = ld.opt_vec(p + "attn_q.bias", q_rows);
      L.bk = ld.opt_vec(p + "attn_k.bias", k_rows);
      L.bv = ld.opt_vec(p + "attn_v.bias", v_rows);
    }
    if (layer_norm) {
      L.attn_norm_b = ld.vec(p + "attn_norm.bias", E);
      L.ffn_norm_b = ld.vec(p + "ffn_norm.bias", E);
    }
    if (c.out_ffn_bias) {
      L.bo = ld.vec(p + "attn_output.bias", E);
      L.b_up = ld.vec(p + "ffn_up.bias", c.n_ff);
      L.b_down = ld.vec(p + "ffn_down.bias", E);
    }
    if (c.qk_norm) {
      L.attn_q_norm = ld.vec(p + "attn_q_norm.weight", c.head_dim_k);
      L.attn_k_norm = ld.vec(p + "attn_k_norm.weight", c.head_dim_k);
    }
    if (c.post_norms) {
      L.post_attn_norm = ld.vec(p + "post_attention_norm.weight", E);
      L.post_ffn_norm = ld.vec(p + "post_ffw_norm.weight", E);
    }
  }
  return w;
}

namespace {

// Whether pack_output_lanes / pack_layer_lanes make a copy of m for the table.
bool to_pack(const cpu::WeightMatrix& m, const cpu::KernelTable& table) {
  return m.data != nullptr && m.lanes == nullptr && cpu::has_lanes_layout(m.type) &&
         table.lanes[static_cast<size_t>(m.type)] != nullptr;
}

// Whether the table's lanes kernel serves every product of a matrix of this type that carries a copy
// (no panel tiles, or lanes_any_tokens), so that the copy replaces its GGUF rows.
bool copy_replaces_rows(const cpu::KernelTable& table, GgmlType type) {
  const auto i = static_cast<size_t>(type);
  return table.panel[i].fn == nullptr || table.lanes_any_tokens[i];
}

// Hands back the mapped pages of rows [r0, r1) of m, a matrix of `file` whose copy replaced them
// (MappedFile::drop_pages: only the whole pages of the range).
void hand_back_rows(const gguf::File& file, const cpu::WeightMatrix& m, int64_t r0, int64_t r1) {
  const uint64_t row = *ggml_row_bytes(m.type, static_cast<uint64_t>(m.k));
  file.drop_pages(
      {m.data + static_cast<uint64_t>(r0) * row, static_cast<size_t>(static_cast<uint64_t>(r1 - r0) * row)});
}

}  // namespace

bool pack_output_lanes(ModelWeights& w, cpu::Isa isa, const gguf::File* file) {
  const cpu::KernelTable& table = cpu::kernel_table(isa);
  cpu::WeightMatrix& o = w.output;
  if (!to_pack(o, table)) return false;
  // Without panel tiles (or where the lanes kernel serves prefill too) every product reads the copy;
  // with them prefill keeps reading the GGUF rows.
  const bool replaces = copy_replaces_rows(table, o.type);
  auto packed = std::make_shared<cpu::LanesWeights>(o.type, o.n_rows, o.k);  // a buffer of its own
  const int64_t groups = cpu::lanes_groups(o.n_rows);
  if (replaces && file != nullptr) {
    // Slice by slice, each slice's rows handed back once packed (Gemma-3-270M: 178 MB of rows).
    const uint64_t row = *ggml_row_bytes(o.type, static_cast<uint64_t>(o.k));
    const int64_t per_slice =
        std::max<int64_t>(1, static_cast<int64_t>(kOutputSliceBytes / (row * cpu::kLaneRows)));
    for (int64_t g = 0; g < groups; g += per_slice) {
      const int64_t g_end = std::min(groups, g + per_slice);
      cpu::pack_lanes_groups(o, *packed, g, g_end);
      hand_back_rows(*file, o, g * cpu::kLaneRows, std::min(o.n_rows, g_end * cpu::kLaneRows));
    }
    hand_back_rows(*file, o, 0, o.n_rows);  // the pages that straddle two slices
  } else {
    cpu::pack_lanes_groups(o, *packed, 0, groups);
  }
  w.lanes.push_back(std::move(packed));
  o.lanes = w.lanes.back()->data();
  // A tied embedding looks its rows up in the same copy (forward.cpp), so that those lookups do not
  // fault the GGUF rows' pages back where they are handed back.
  if (w.tied_output) w.tok_embd.lanes = o.lanes;
  if (!replaces) w.lanes_extra_bytes += w.lanes.back()->size();
  return replaces;
}

void pack_layer_lanes(ModelWeights& w, cpu::Isa isa, const gguf::File* file) {
  const cpu::KernelTable& table = cpu::kernel_table(isa);
  // One buffer for all: each matrix alone would take whole 2 MiB pages (Gemma-3-270M's 126 matrices
  // of 0.1-0.9 MB held 250 MB for their 68 MB that way).
  std::vector<cpu::WeightMatrix*> todo;
  size_t total = 0;
  for (LayerWeights& L : w.layers) {
    for (cpu::WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) {
      if (!to_pack(*m, table)) continue;
      todo.push_back(m);
      total += static_cast<size_t>(cpu::lanes_bytes(m->type, m->n_rows, m->k));  // a multiple of 64
    }
  }
  if (todo.empty()) return;
  const auto buffer = std::make_shared<const cpu::LanesBuffer>(total);
  size_t offset = 0;
  for (cpu::WeightMatrix* m : todo) {
    auto packed = std::make_shared<cpu::LanesWeights>(m->type, m->n_rows, m->k, buffer, offset);
    cpu::pack_lanes_into(*m, *packed);
    offset += packed->size();
    m->lanes = packed->data();
    if (!copy_replaces_rows(table, m->type)) {
      w.lanes_extra_bytes += packed->size();
    } else if (file != nullptr) {  // the rows are read no more: their pages go back now, one matrix
                                   // at a time, so that the copies and the rows never all stand together
      hand_back_rows(*file, *m, 0, m->n_rows);
    }
    w.lanes.push_back(std::move(packed));
  }
}

bool output_in_lanes(const ModelWeights& w, cpu::Isa isa) {
  return w.output.lanes != nullptr && cpu::isa_supported(isa) &&
         cpu::kernel_table(isa).lanes[static_cast<size_t>(w.output.type)] != nullptr;
}

}  // namespace kvtier::model
