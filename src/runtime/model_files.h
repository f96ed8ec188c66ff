// A model loaded from a GGUF file: the mapped file, hparams, forward-pass configuration, weights
// and tokenizer. Immutable once loaded; sessions refer to it.
#pragma once

#include <memory>
#include <string>

#include "gguf/reader.h"
#include "model/config.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvtier::runtime {

struct LoadedModel {
  std::unique_ptr<gguf::File> file;
  model::Hparams hparams;
  model::ModelConfig config;
  model::ModelWeights weights;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
};

// Throws Error naming the file and what is wrong (unsupported architecture, missing tensor, ...).
std::unique_ptr<LoadedModel> load_model(const std::string& path);

}  // namespace kvtier::runtime
