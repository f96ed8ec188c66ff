// Helpers of the model-level GPU tests: where the GGUF test models are (KVTIER_MODEL_DIR, set by
// CMake, default <source>/models), small synthetic models written to a temporary GGUF, greedy
// decoding on the CPU session and on the CUDA session, and a loud skip when a file is missing.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <map>
#include <memory>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "common/temp_file.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/cuda/cuda_session.h"
#include "runtime/model_files.h"
#include "runtime/session.h"

namespace kvtier::cuda::test {

inline std::string model_path(const char* file) {
  return std::string(KVTIER_MODEL_DIR) + "/" + file;
}

#define KVTIER_REQUIRE_FILE(path)                                                                          \
  do {                                                                                                     \
    if (!std::filesystem::exists(path)) {                                                                  \
      std::fprintf(                                                                                        \
          stderr,                                                                                          \
          "*** SKIPPED: %s is missing (configure with -DKVTIER_MODEL_DIR=...); test %s did not run ***\n", \
          std::string(path).c_str(), ::testing::UnitTest::GetInstance()->current_test_info()->name());     \
      GTEST_SKIP() << "missing " << (path);                                                                \
    }                                                                                                      \
  } while (0)

// A small GQA model of 8 KV heads (so head groups of 8, 4, 2 and 1 all divide), llama or qwen2
// (Q/K/V biases), written once per process to a temporary GGUF.
inline std::string synth_gqa8_file(std::string_view arch) {
  const bool qwen = arch == "qwen2";
  const model::Preset p{qwen ? "test-qwen2-gqa8" : "test-llama-gqa8",
                        arch,
                        "GPU test model (GQA 16/8)",
                        3,
                        512,
                        16,
                        8,
                        32,
                        768,
                        272,
                        4096,
                        10000.0f,
                        1e-5f,
                        false,
                        qwen};
  // One file per architecture and process, removed at exit.
  static std::map<std::string, std::unique_ptr<::kvtier::test::TempFile>, std::less<>> files;
  auto& f = files[std::string(arch)];
  if (!f) {
    f = std::make_unique<::kvtier::test::TempFile>("kvtier_cuda_" + std::string(p.name), ".gguf");
    model::SynthOptions o;
    o.type = GgmlType::kQ8_0;
    o.seed = 11;
    o.n_ctx = 4096;
    model::synth_writer(p, o).write(f->str());
  }
  return f->str();
}

using model::TokenId;

inline TokenId argmax(std::span<const float> l) {
  return static_cast<TokenId>(std::max_element(l.begin(), l.end()) - l.begin());
}

// Token ids of a deterministic pseudo-text over the first `vocab` ids (no tokenizer needed).
inline std::vector<TokenId> test_prompt(size_t n, uint32_t vocab) {
  std::vector<TokenId> t;
  for (size_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((i * 37 + 11) % vocab));
  return t;
}

// What one sequence produced: the logits after every forward pass (each prefill chunk's last
// position, then each decode step) and the greedy tokens.
struct SequenceResult {
  std::vector<std::vector<float>> logits;
  std::vector<TokenId> tokens;
};

// Prefill `prompt` chunk by chunk (one pass per chunk, keeping each pass's logits), then `n_decode`
// greedy steps. Works for runtime::Session and runtime_cuda::CudaSession alike.
template <typename S>
SequenceResult run_sequence(S& s, const std::vector<TokenId>& prompt, int64_t chunk, int n_decode) {
  SequenceResult r;
  for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(chunk)) {
    const size_t n = std::min(prompt.size() - i, static_cast<size_t>(chunk));
    const auto l = s.prefill(std::span<const TokenId>(prompt).subspan(i, n));
    r.logits.emplace_back(l.begin(), l.end());
  }
  for (int step = 0; step < n_decode; ++step) {
    const TokenId t = argmax(r.logits.back());
    r.tokens.push_back(t);
    const auto l = s.decode(t);
    r.logits.emplace_back(l.begin(), l.end());
  }
  return r;
}

}  // namespace kvtier::cuda::test
