// InfiniGen's offline step on a real model (spec infinigen.md §4.1, §4.4, §15.11): run the model over
// a sample text, collect each layer's queries and keys after RoPE (through kv::RecordingKv, so the
// pass computes what it computes without it), and compute per layer and KV head the skewing matrix
// (skew::skew_matrix of the group's stacked queries) and the offline partial columns. Also the
// checks of a skew file on held-out text: A1 (q~·k~ = q·k) and A3 (energy concentration).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "model/forward.h"
#include "runtime/model_files.h"
#include "skew/skew_file.h"

namespace kvtier::runtime {

struct SkewOptions {
  double partial_ratio = 0.3;  // r of the offline column sets
  int64_t chunk = 0;           // prefill chunk (0: default_chunk)
  int threads = 1;
  std::optional<cpu::Isa> isa;
  // Also InfiniGen's look-ahead queries: layer l's query projection of layer l-1's input (§6.2),
  // for layers >= 1 (the pass records the layer inputs; costs a q projection per layer).
  bool lookahead = false;
};

enum class SkewStage { kForward, kMatrices };
// (stage, done, total): tokens of the forward pass, then layers.
using SkewProgress = std::function<void(SkewStage, int64_t, int64_t)>;

// One layer's samples, per KV head g: the post-RoPE queries of its G = n_head / n_head_kv query
// heads and its post-RoPE keys, over n tokens.
struct LayerSamples {
  uint32_t n_head_kv = 0;
  int64_t group = 0;                  // G
  int64_t n = 0;                      // tokens
  std::vector<std::vector<float>> q;  // [n_head_kv][n * G, d] f32 (token-major, then head of group)
  std::vector<std::vector<float>> k;  // [n_head_kv][n, d] f32
  // SkewOptions::lookahead, layers >= 1: layer l's queries from layer l-1's input, laid out as q.
  std::vector<std::vector<float>> q_ahead;
};

// Runs the model over `tokens` (one sequence, chunked prefill, resident f32 KV) and returns every
// layer's samples.
std::vector<LayerSamples> collect_samples(const LoadedModel& model, std::span<const model::TokenId> tokens,
                                          const SkewOptions& opt, const SkewProgress& progress = {});

// The skew set of the samples (model_hash and sample_source are the caller's to fill).
skew::SkewSet compute_skew(const LoadedModel& model, const std::vector<LayerSamples>& samples,
                           double partial_ratio, const SkewProgress& progress = {});

// Reads a skew file for this model: the model hash (of the model's file) must match, and so must the
// layers, KV heads and head size. Throws Error(kInvalidFile) naming the file and the mismatch.
skew::SkewSet load_skew_for(const LoadedModel& model, const std::string& path);

// The skew file the selection infinigen runs with: `path`, or by default the model's path with ".gguf"
// replaced by ".skew.gguf" (infinigen_skew_path). A missing, foreign or corrupt file is an error that
// names it and gives the `kvtier skew` command that makes the right one; nothing is built on the fly
// (the SVD pass over sample text takes a while and its sample is the user's choice).
std::string infinigen_skew_path(const LoadedModel& model, const std::string& path);
// The same from the model file's path (before the model is loaded).
std::string infinigen_skew_path(const std::string& model_path, const std::string& path);
skew::SkewSet load_infinigen_skew(const LoadedModel& model, const std::string& path);

struct LayerCheck {
  double a1_error = 0.0;       // max over KV heads of max|Q K^T - Q~ K~^T| / max|Q K^T|
  double share_plain = 0.0;    // share of sum |Q| + |K| in the top floor(r·d) columns, unskewed
  double share_skewed = 0.0;   // the same of Q~ = Q·A, K~ = K·A
  double q_share_plain = 0.0;  // the shares of sum |Q| alone (what the SVD of Q concentrates)
  double q_share_skewed = 0.0;
  double q_energy_plain = 0.0;  // share of sum Q^2 (the SVD's objective) in the top floor(r·d) columns
  double q_energy_skewed = 0.0;
};
// The checks on held-out samples; the A1 pairs use the first min(n, max_rows) tokens.
std::vector<LayerCheck> check_skew(const skew::SkewSet& set, const std::vector<LayerSamples>& held_out,
                                   int64_t max_rows = 256);

}  // namespace kvtier::runtime
