#include "kv/kv_compute.h"

#include "core/error.h"

namespace kvtier::kv {

void KvCompute::project_q(uint32_t layer, const float*, std::span<const int64_t>, float*) {
  fail(ErrorKind::kInternal, "this compute hook cannot project the queries of layer {}", layer);
}

}  // namespace kvtier::kv
