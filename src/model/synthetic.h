// Synthetic models: random weights of a preset's shape with a small byte-level vocabulary.
// Weight values are a pure function of (seed, tensor name, element index), so any backend can
// generate the same model in memory, in parallel, without a file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "gguf/writer.h"
#include "model/presets.h"

namespace kvtier::model {

struct SynthOptions {
  GgmlType type = GgmlType::kF16;  // type of the 2-D weight matrices (norms and biases stay f32)
  uint64_t seed = 0;
  uint32_t n_layer = 0;  // 0: the preset's
  uint32_t n_ctx = 0;    // 0: the preset's
};

enum class SynthInit {
  kOnes,     // norm weights
  kUniform,  // uniform with standard deviation `scale`
};

struct SynthTensor {
  std::string name;
  std::vector<uint64_t> ne;  // fastest-varying first
  GgmlType type;
  SynthInit init;
  float scale;
};

// The tensors of the model, in file order.
std::vector<SynthTensor> synth_tensors(const Preset& preset, const SynthOptions& opts);

// Elements in all of the preset's tensors (its parameter count).
uint64_t parameter_count(const Preset& preset);

// Values of elements [first, first + out.size()) of a tensor, as f32.
void synth_values(const SynthTensor& t, uint64_t seed, uint64_t first, std::span<float> out);

// A writer holding the whole model (metadata, tokenizer, tensors filled lazily at write time).
gguf::Writer synth_writer(const Preset& preset, const SynthOptions& opts);

// The byte-level vocabulary of synthetic models: 256 byte tokens (GPT-2 byte-to-unicode mapping),
// then <|begin_of_text|>, <|end_of_text|>, then reserved tokens up to n_vocab.
std::vector<std::string> synth_vocab(uint32_t n_vocab);

}  // namespace kvtier::model
