#include "runtime/model_files.h"

namespace kvtier::runtime {

std::unique_ptr<LoadedModel> load_model(const std::string& path) {
  auto m = std::make_unique<LoadedModel>();
  m->file = std::make_unique<gguf::File>(path);
  m->hparams = model::read_hparams(*m->file);
  m->config = model::make_config(m->hparams);
  m->weights = model::load_weights(*m->file, m->config);
  m->tokenizer = std::make_unique<tokenizer::Tokenizer>(*m->file);
  return m;
}

}  // namespace kvtier::runtime
