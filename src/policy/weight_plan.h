// Weight placement (HybridServe's weight streaming, spec hybridserve.md §4.4, A14): which decoder
// layers keep their weights in compute-local memory under a budget, and how big the double-buffered
// staging of the others is. A pure function: the engine and `kvtier plan` call the same one.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtier::policy {

// Where the streamed layers' weights come from.
enum class WeightSource {
  kHost,  // a copy in host memory (the paper's pinned host weights)
  kFile,  // read straight from the GGUF file on every pass (O_DIRECT where the file system allows)
};

struct WeightPlanInput {
  uint64_t budget = 0;       // compute-local bytes for weights (resident + staging); 0 = all resident
  uint64_t fixed_bytes = 0;  // weights outside the decoder layers (embeddings, output, norms)
  std::vector<uint64_t> layer_bytes;  // [n_layer] bytes of each layer's tensors
  std::vector<uint64_t> stage_bytes;  // [n_layer] bytes one staging slot needs for that layer (aligned)
};

struct WeightPlan {
  uint32_t resident_layers = 0;  // layers [0, resident_layers) resident, the rest streamed
  uint64_t resident_bytes = 0;   // fixed_bytes + the resident layers' bytes
  uint64_t staging_bytes = 0;    // two slots of the largest streamed layer (0 if none is streamed)
  uint64_t streamed_bytes = 0;   // the streamed layers' bytes (their home: host memory or the file)
  bool streams() const { return staging_bytes > 0; }
  uint64_t device_bytes() const { return resident_bytes + staging_bytes; }
};

// The most leading layers that fit the budget beside the staging the rest needs. Throws
// Error(kBudget) when not even the fixed weights plus two staging slots of the largest layer fit,
// naming the bytes needed.
WeightPlan plan_weights(const WeightPlanInput& in);

}  // namespace kvtier::policy
