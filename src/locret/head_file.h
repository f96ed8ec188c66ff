// The sidecar GGUF of a model's retaining heads (`--locret-heads FILE`), written through
// gguf::Writer (atomic: a temporary file renamed into place) and read through gguf::File.
//
//   locret.format_version   u32   1
//   locret.model_hash       str   file_xxh3_tag() (core/content_hash.h) of the backbone the heads were
//   trained on locret.model_name       str   the backbone's general.name (informational) locret.layer_count
//   u32   L locret.intermediate_size u32  d_m locret.activation       str   silu | gelu_tanh
//   locret.provenance.*     str   how the file was made (command, data, steps, ...)
//   locret.blk.{l}.fc1.weight  F32 ne [d_in, d_m]     (d_m rows of d_in: torch fc1.weight layout)
//   locret.blk.{l}.fc2.weight  F32 ne [d_m, h_kv]
// A training checkpoint adds the optimiser: locret.train.step (u64, steps taken) and the AdamW
// moments locret.blk.{l}.fc{1,2}.adam_m / .adam_v of the weights' shapes.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "locret/optimizer.h"
#include "locret/retaining_head.h"
#include "model/config.h"

namespace kvtier::locret {

struct HeadFileMeta {
  std::string model_hash;
  std::string model_name;
  std::vector<std::pair<std::string, std::string>> provenance;  // locret.provenance.<key> = value
};

struct HeadFile {
  RetainingHeads heads;
  HeadFileMeta meta;
  std::optional<OptimizerState> optimizer;  // checkpoints only
};

// Writes the heads (and, for a checkpoint, the optimiser state) atomically; Error(kIo) on failure.
void save_heads(const std::string& path, const RetainingHeads& heads, const HeadFileMeta& meta,
                const OptimizerState* optimizer = nullptr);

// Reads a head file and checks it is self-consistent (keys, tensor names, types and shapes); throws
// Error(kInvalidFile) naming the file and the problem.
HeadFile read_heads(const std::string& path);

// read_heads, then checks the file against the backbone: its hash (trained for another model is an
// error naming both hashes) and the per-layer shapes the model's configuration implies.
HeadFile load_heads(const std::string& path, const std::string& model_hash, const model::ModelConfig& cfg);

}  // namespace kvtier::locret
