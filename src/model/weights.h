// The model's tensors, found by GGUF name and checked for shape and type when loaded. Pointers
// refer to the mapped file (which must outlive the weights); load_weights copies nothing.
// pack_output_lanes and pack_layer_lanes may add rows-in-lanes copies of matrices for the CPU
// kernels, owned here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/weight_lanes.h"
#include "gguf/reader.h"
#include "model/config.h"

namespace kvtier::model {

struct LayerWeights {
  const float* attn_norm = nullptr;       // [n_embd] f32
  const float* attn_norm_b = nullptr;     // [n_embd] f32 (LayerNorm bias, OPT)
  const float* ffn_norm_b = nullptr;      // [n_embd] f32 (LayerNorm bias, OPT)
  const float* attn_q_norm = nullptr;     // [head_dim_k] f32 (Gemma-3)
  const float* attn_k_norm = nullptr;     // [head_dim_k] f32 (Gemma-3)
  const float* post_attn_norm = nullptr;  // [n_embd] f32 (Gemma-3)
  const float* ffn_norm = nullptr;        // [n_embd] f32
  const float* post_ffn_norm = nullptr;   // [n_embd] f32 (Gemma-3)
  cpu::WeightMatrix wq;                   // [n_head * head_dim_k, n_embd]
  cpu::WeightMatrix wk;                   // [n_head_kv * head_dim_k, n_embd]
  cpu::WeightMatrix wv;                   // [n_head_kv * head_dim_v, n_embd]
  cpu::WeightMatrix wo;                   // [n_embd, n_head * head_dim_v]
  const float* bq = nullptr;              // [n_head * head_dim_k] f32 (Qwen2)
  const float* bk = nullptr;              // [n_head_kv * head_dim_k] f32
  const float* bv = nullptr;              // [n_head_kv * head_dim_v] f32
  const float* bo = nullptr;              // [n_embd] f32 (OPT)
  cpu::WeightMatrix gate;                 // [n_ff, n_embd] (absent for an ungated FFN: OPT)
  cpu::WeightMatrix up;                   // [n_ff, n_embd]
  cpu::WeightMatrix down;                 // [n_embd, n_ff]
  const float* b_up = nullptr;            // [n_ff] f32 (OPT)
  const float* b_down = nullptr;          // [n_embd] f32 (OPT)
};

struct ModelWeights {
  cpu::WeightMatrix tok_embd;            // [n_vocab, n_embd]; .lanes: the output's copy when tied
  const float* output_norm = nullptr;    // [n_embd] f32
  const float* output_norm_b = nullptr;  // [n_embd] f32 (LayerNorm bias, OPT)
  cpu::WeightMatrix pos_embd;            // [n_ctx_train, n_embd]: learned positions (OPT), row = position
  cpu::WeightMatrix output;              // [n_vocab, n_embd]: output.weight, or tok_embd when tied
  bool tied_output = false;
  const float* rope_freqs = nullptr;  // [n_rot / 2] f32: Llama-3 frequency factors (optional)
  std::vector<LayerWeights> layers;
  uint64_t bytes = 0;  // bytes of all tensors used
  // Rows-in-lanes copies (pack_output_lanes, pack_layer_lanes; the matrices' .lanes point into
  // them), and the bytes they hold on top of the mapped file: the copies of matrices whose GGUF rows
  // prefill still reads (the layers'; the output matrix's where its type has panel tiles that its
  // lanes kernel does not replace). A copy that replaces its GGUF rows (the q8_0 output matrix) is
  // not counted: load_model hands those mapped pages back.
  std::vector<std::shared_ptr<const cpu::LanesWeights>> lanes;
  uint64_t lanes_extra_bytes = 0;
};

// Finds every tensor the configuration needs. Throws Error(kInvalidFile) naming a missing tensor
// or one of the wrong shape, Error(kUnsupported) naming a tensor of a type the CPU kernels lack.
ModelWeights load_weights(const gguf::File& file, const ModelConfig& cfg);

// Rows-in-lanes copies (backend/cpu/weight_lanes.h) of the matrices whose type the CPU kernels of
// `isa` have a lanes kernel for; matmul then reads them for one-token products (decode), with the
// same bits.
// The output matrix (most of a small model's bytes per decoded token: Gemma-3-270M 178 of 257 MB).
// Returns whether its copy replaces its GGUF rows for every product: where its type has no panel
// tiles, or the table's lanes kernel serves every product (KernelTable::lanes_any_tokens: q8_0);
// else the copy counts in lanes_extra_bytes. Where it replaces them and `file` is given, the rows'
// mapped pages are handed back slice by slice as the copy is made (kOutputSliceBytes of rows at a
// time), so that the whole matrix never stands in memory twice.
bool pack_output_lanes(ModelWeights& w, cpu::Isa isa, const gguf::File* file = nullptr);
// GGUF bytes of the output matrix's rows packed between two hand-backs (pack_output_lanes).
constexpr uint64_t kOutputSliceBytes = uint64_t{16} << 20;
// The layers' matrices, in one shared buffer. A copy replaces its matrix's GGUF rows by the rule of
// pack_output_lanes (on the AVX-512 path without AMX every lanes type: its lanes kernels serve
// prefill too), and then, where `file` is given, the rows' mapped pages are handed back as soon as
// the copy is made; else (prefill keeps reading the GGUF rows: the AVX2 path's panel tiles, AMX) the
// copy costs its bytes again, counted in lanes_extra_bytes.
void pack_layer_lanes(ModelWeights& w, cpu::Isa isa, const gguf::File* file = nullptr);
// Whether the CPU kernels of `isa` read the output matrix from its rows-in-lanes copy.
bool output_in_lanes(const ModelWeights& w, cpu::Isa isa);

}  // namespace kvtier::model
