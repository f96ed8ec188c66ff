// The retaining heads as the KV cache's unit scorer (kv::UnitScorer): the `locret` retention scores
// every new KV unit through RetainingHeads::score, the code the trainer runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kv/unit_scorer.h"
#include "locret/retaining_head.h"
#include "model/config.h"

namespace kvtier::locret {

class HeadScorer final : public kv::UnitScorer {
 public:
  explicit HeadScorer(RetainingHeads heads) : heads_(std::move(heads)) {}
  void score(ThreadPool& pool, cpu::Isa isa, uint32_t layer, int64_t pos0, const float* q_pre,
             const float* k_pre, const float* v, int64_t n, float* scores) override;
  const RetainingHeads& heads() const { return heads_; }

 private:
  RetainingHeads heads_;
  std::vector<float> scratch_;  // grown to the largest pass's need
};

// Loads `heads_path` for the model at `model_path` (its hash and shapes checked, load_heads); an
// error names the command that builds heads for this model.
std::shared_ptr<kv::UnitScorer> load_head_scorer(const std::string& heads_path, const std::string& model_path,
                                                 const model::ModelConfig& cfg);

}  // namespace kvtier::locret
