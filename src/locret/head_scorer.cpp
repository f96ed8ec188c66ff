#include "locret/head_scorer.h"

#include "core/content_hash.h"
#include "core/error.h"
#include "locret/head_file.h"

namespace kvtier::locret {

void HeadScorer::score(ThreadPool& pool, cpu::Isa isa, uint32_t layer, int64_t pos0, const float* q_pre,
                       const float* k_pre, const float* v, int64_t n, float* scores) {
  (void)pos0;  // the heads see the token's own q, k, v only
  const size_t need = heads_.scratch_floats(layer, n);
  if (scratch_.size() < need) scratch_.resize(need);
  heads_.score(Compute{&pool, isa}, layer, q_pre, k_pre, v, n, scores, scratch_);
}

std::shared_ptr<kv::UnitScorer> load_head_scorer(const std::string& heads_path, const std::string& model_path,
                                                 const model::ModelConfig& cfg) {
  const std::string build = fmt::format(
      "build heads for this model with `scripts/train_locret_heads.sh {} OUT_DIR` (docs/locret.md)",
      model_path);
  if (heads_path.empty()) {
    fail(ErrorKind::kInvalidArgument,
         "locret scores KV units with retaining heads trained for the model: give --locret-heads FILE; {}",
         build);
  }
  try {
    return std::make_shared<HeadScorer>(load_heads(heads_path, file_xxh3_tag(model_path), cfg).heads);
  } catch (const Error& e) {
    fail(e.kind(), "{}; {}", e.what(), build);
  }
}

}  // namespace kvtier::locret
