#include "kv/geometry.h"

#include <algorithm>

#include "core/error.h"

namespace kvtier::kv {

uint32_t KvGeometry::heads_per_group(uint32_t layer) const {
  const uint32_t h = n_head_kv[layer];
  return group_heads == 0 || group_heads > h ? h : group_heads;
}

uint64_t KvGeometry::block_bytes(uint32_t layer) const {
  return uint64_t{heads_per_group(layer)} * block_tokens * (head_dim_k + head_dim_v) *
         cpu::kv_dtype_bytes(dtype);
}

void KvGeometry::validate() const {
  if (n_head_kv.empty()) fail(ErrorKind::kInvalidArgument, "KV geometry without layers");
  if (head_dim_k == 0 || head_dim_v == 0) fail(ErrorKind::kInvalidArgument, "KV head dimension of 0");
  if (block_tokens == 0 || block_tokens % cpu::kAttnTile != 0) {
    fail(ErrorKind::kInvalidArgument, "KV block of {} tokens: must be a positive multiple of {}",
         block_tokens, cpu::kAttnTile);
  }
  if (!window.empty() && window.size() != n_head_kv.size()) {
    fail(ErrorKind::kInvalidArgument, "KV geometry: {} windows for {} layers", window.size(),
         n_head_kv.size());
  }
  for (uint32_t l = 0; l < n_layer(); ++l) {
    if (n_head_kv[l] == 0) fail(ErrorKind::kInvalidArgument, "layer {} has no KV heads", l);
    if (n_head_kv[l] % heads_per_group(l) != 0) {
      fail(ErrorKind::kInvalidArgument, "{} KV heads per group do not divide the {} KV heads of layer {}",
           group_heads, n_head_kv[l], l);
    }
  }
}

uint32_t KvGeometry::max_q_per_kv(uint32_t n_head) const {
  uint32_t m = 1;
  for (uint32_t l = 0; l < n_layer(); ++l) {
    if (n_head_kv[l] == 0 || n_head % n_head_kv[l] != 0) {
      fail(ErrorKind::kInvalidArgument, "{} KV heads of layer {} do not divide {} query heads", n_head_kv[l],
           l, n_head);
    }
    m = std::max(m, n_head / n_head_kv[l]);
  }
  return m;
}

uint32_t KvGeometry::max_head_kv() const {
  uint32_t m = 1;
  for (uint32_t h : n_head_kv) m = std::max(m, h);
  return m;
}

uint64_t KvGeometry::attention_scratch_bytes(uint32_t n_head, int threads) const {
  cpu::AttnParams ap;
  ap.head_dim_k = head_dim_k;
  ap.head_dim_v = head_dim_v;
  ap.q_per_kv = max_q_per_kv(n_head);
  return cpu::attention_scratch_bytes(ap, threads);
}

}  // namespace kvtier::kv
