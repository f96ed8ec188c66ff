// Memory model of the KV placement methods (HeadInfer spec section 5, paper App. A.3/B.1): bytes per
// tier and category for a context of S tokens, and the largest S that fits given budgets.
// Pure arithmetic -- no backend, no allocation -- so the planner and tests can use it anywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace kvtier::policy {

enum class Method {
  kStandard,   // full KV and full-sequence activations in compute memory
  kChunked,    // standard with chunked prefill (activations for one chunk)
  kKvQuant4,   // 4-bit KV (scales ignored), full-sequence activations
  kLayer,      // layer-wise offload: one layer's KV in a ping-pong pair, full-sequence activations
  kHeadInfer,  // head-group offload (g KV heads per unit) with chunked prefill
};

std::string_view method_name(Method m);
std::optional<Method> method_from_name(std::string_view name);
std::span<const Method> all_methods();

struct ModelShape {
  uint32_t n_layer = 0;
  uint32_t n_embd = 0;  // D
  uint32_t n_ff = 0;    // I (MLP intermediate)
  uint32_t n_head = 0;  // H_q
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;
  uint64_t weight_bytes = 0;
};

struct PlanInputs {
  uint64_t n_ctx = 0;           // S: tokens of context (prompt + generated)
  uint64_t chunk = 10240;       // C: prefill chunk (methods that chunk)
  uint32_t kv_elem_bytes = 2;   // b for KV (bf16/f16)
  uint32_t act_elem_bytes = 2;  // b for activations
  uint32_t group = 0;           // HeadInfer g (KV heads per unit); 0 = adaptive
  uint64_t device_budget = 0;   // compute-local memory budget in bytes; 0 = unlimited
  uint64_t host_budget = 0;     // host (pinned) memory budget for offloaded KV; 0 = unlimited
};

struct MemoryPlan {
  Method method = Method::kStandard;
  uint32_t group = 0;  // HeadInfer g used (0 for other methods)
  // Compute-local (device) memory by category.
  uint64_t device_weights = 0;
  uint64_t device_kv = 0;
  uint64_t device_activations = 0;
  uint64_t device_total() const { return device_weights + device_kv + device_activations; }
  // Host memory: the offloaded KV master copy.
  uint64_t host_kv = 0;
  uint64_t total_kv = 0;  // all KV of the context wherever it lives
  bool fits = true;       // within both budgets
};

// KV bytes of one token over all layers (K and V).
uint64_t kv_bytes_per_token(const ModelShape& m, uint32_t elem_bytes);

// HeadInfer's adaptive group: the largest g dividing n_head_kv whose ping-pong pair for n_ctx tokens
// (2 buffers x K,V x g heads x S x d_h x b) fits in `pingpong_budget` bytes; 0 if even g = 1 does not.
uint32_t adaptive_group(const ModelShape& m, uint64_t n_ctx, uint32_t kv_elem_bytes,
                        uint64_t pingpong_budget);

MemoryPlan plan_memory(const ModelShape& m, Method method, const PlanInputs& in);

// The largest context (tokens) whose plan fits both budgets; for HeadInfer with group 0 the best
// over all g. Returns 0 when nothing fits; a large value when no budget binds.
uint64_t max_context(const ModelShape& m, Method method, const PlanInputs& in);

}  // namespace kvtier::policy
