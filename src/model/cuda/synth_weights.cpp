#include "model/cuda/synth_weights.h"

#include <cuda_runtime_api.h>

#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/synth.h"
#include "core/error.h"

namespace kvtier::model_cuda {

model::Hparams preset_hparams(const model::Preset& p, const model::SynthOptions& o) {
  model::Hparams h;
  h.arch_name = std::string(p.arch);
  h.arch = model::arch_from_name(h.arch_name);
  h.n_layer = o.n_layer ? o.n_layer : p.n_layer;
  h.n_embd = p.n_embd;
  h.n_ff = p.n_ff;
  h.n_head = p.n_head;
  h.n_head_kv.assign(h.n_layer, p.n_head_kv);
  h.head_dim_k = p.head_dim;
  h.head_dim_v = p.head_dim;
  h.n_ctx_train = o.n_ctx ? o.n_ctx : p.n_ctx;
  h.n_vocab = p.n_vocab;
  h.rope_freq_base = p.rope_freq_base;
  h.rope_dim = p.head_dim;
  h.rms_eps = p.rms_eps;
  return h;
}

DeviceWeights synth_device_weights(cuda::Context& ctx, const model::Preset& p, const model::SynthOptions& o,
                                   kv::MemoryLedger& ledger) {
  if (model::arch_from_name(std::string(p.arch)) == model::Arch::kOpt)
    fail(ErrorKind::kUnsupported, "preset {}: the CUDA backend has no OPT forward pass yet (CPU only)",
         p.name);
  const std::vector<model::SynthTensor> tensors = model::synth_tensors(p, o);
  const uint32_t n_layer = o.n_layer ? o.n_layer : p.n_layer;
  uint64_t bytes = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (uint64_t e : t.ne) n *= e;
    bytes += (n * (t.ne.size() == 2 ? 2 : 4) + 255) / 256 * 256;
  }
  DeviceWeights d;
  d.reservation = kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kWeights, bytes);
  d.layers.resize(n_layer);
  cudaStream_t s = ctx.streams().compute.get();
  for (const auto& t : tensors) {
    const uint64_t key = cuda::synth_key(o.seed, t.name);
    uint64_t n = 1;
    for (uint64_t e : t.ne) n *= e;
    if (t.ne.size() == 2) {
      auto* w = ctx.arena().allocate<uint16_t>(n, "synthetic weight matrix");
      cuda::synth_uniform_bf16(key, t.scale, 0, static_cast<int64_t>(n), w, s);
      const DeviceMatrix m{w, static_cast<int64_t>(t.ne[1]), static_cast<int64_t>(t.ne[0])};
      if (t.name == "token_embd.weight") {
        d.tok_embd = m;
      } else if (t.name == "output.weight") {
        d.output = m;
      } else {
        const size_t dot = t.name.find('.', 4);
        const auto l = static_cast<uint32_t>(std::stoul(t.name.substr(4, dot - 4)));
        const std::string what = t.name.substr(dot + 1);
        DeviceLayerWeights& L = d.layers.at(l);
        DeviceMatrix* slot = what == "attn_q.weight"        ? &L.wq
                             : what == "attn_k.weight"      ? &L.wk
                             : what == "attn_v.weight"      ? &L.wv
                             : what == "attn_output.weight" ? &L.wo
                             : what == "ffn_gate.weight"    ? &L.gate
                             : what == "ffn_up.weight"      ? &L.up
                             : what == "ffn_down.weight"    ? &L.down
                                                            : nullptr;
        if (slot == nullptr) fail(ErrorKind::kUnsupported, "synthetic tensor {} has no device slot", t.name);
        *slot = m;
      }
    } else {
      auto* v = ctx.arena().allocate<float>(n, "synthetic weight vector");
      if (t.init == model::SynthInit::kOnes) {
        cuda::fill_f32(1.0f, static_cast<int64_t>(n), v, s);
      } else {
        cuda::synth_uniform_f32(key, t.scale, 0, static_cast<int64_t>(n), v, s);
      }
      if (t.name == "output_norm.weight") {
        d.output_norm = v;
      } else {
        const size_t dot = t.name.find('.', 4);
        const auto l = static_cast<uint32_t>(std::stoul(t.name.substr(4, dot - 4)));
        const std::string what = t.name.substr(dot + 1);
        DeviceLayerWeights& L = d.layers.at(l);
        const float** slot = what == "attn_norm.weight"  ? &L.attn_norm
                             : what == "ffn_norm.weight" ? &L.ffn_norm
                             : what == "attn_q.bias"     ? &L.bq
                             : what == "attn_k.bias"     ? &L.bk
                             : what == "attn_v.bias"     ? &L.bv
                                                         : nullptr;
        if (slot == nullptr) fail(ErrorKind::kUnsupported, "synthetic tensor {} has no device slot", t.name);
        *slot = v;
      }
    }
    d.bytes += (n * (t.ne.size() == 2 ? 2 : 4) + 255) / 256 * 256;
  }
  if (p.tied_embeddings) d.output = d.tok_embd;
  KVTIER_CUDA_CHECK(cudaStreamSynchronize(s));
  return d;
}

}  // namespace kvtier::model_cuda
