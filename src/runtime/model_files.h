// A model loaded from a GGUF file: the mapped file, hparams, forward-pass configuration, weights
// and tokenizer. Immutable once loaded; sessions refer to it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/cpu/cpu_features.h"
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

struct LoadOptions {
  // The CPU path the sessions will use: the output matrix is packed for its kernels
  // (model::pack_output_lanes), and its mapped pages are handed back as it is packed. nullopt: the weights
  // stay as mapped (a GPU session, which uploads the file's bytes).
  std::optional<cpu::Isa> cpu_isa = cpu::best_isa();
  // Also the layers' matrices (model::pack_layer_lanes; their pages handed back where the copies
  // replace their rows, else at the cost of their bytes again): for sessions
  // that hold every layer (no weight streaming).
  bool pack_layers = true;
};

// Throws Error naming the file and what is wrong (unsupported architecture, missing tensor, ...).
std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& opt = {});

}  // namespace kvtier::runtime
