#include "kv/kv_compute.h"

#include "core/error.h"

namespace kvtier::kv {

void KvCompute::encode_inputs(uint32_t layer, const float* x, int64_t n, uint8_t* out) {
  (void)x, (void)n, (void)out;
  fail(ErrorKind::kUnsupported, "this model hook cannot encode the inputs of layer {} (KVPR)", layer);
}

void KvCompute::project_kv_encoded(uint32_t layer, const uint8_t* act, std::span<const int64_t> positions,
                                   uint32_t head0, uint32_t n_heads, float* k, float* v) {
  (void)act, (void)positions, (void)head0, (void)n_heads, (void)k, (void)v;
  fail(ErrorKind::kUnsupported, "this model hook cannot recompute K/V of layer {} from inputs (KVPR)", layer);
}

void KvCompute::project_q(uint32_t layer, const float* x, std::span<const int64_t> positions, float* q) {
  (void)x, (void)positions, (void)q;
  fail(ErrorKind::kUnsupported, "this model hook cannot project the queries of layer {} (InfiniGen)", layer);
}

}  // namespace kvtier::kv

namespace kvtier::kv {

void KvCompute::rope_k_rows(uint32_t layer, const float* k_pre, std::span<const int64_t> positions,
                            float* out) {
  (void)k_pre, (void)positions, (void)out;
  fail(ErrorKind::kUnsupported, "this model hook cannot re-rotate the keys of layer {} (Locret)", layer);
}

}  // namespace kvtier::kv
