// locret_needle_kept: which of a passkey needle's tokens locret keeps, per layer, after prefill (a
// diagnostic for docs/accuracy.md: does a miss come from the eviction of the needle or from the
// model's reading of what was kept?). The prompts are `kvtier eval passkey`'s (chat template, seed 0,
// the grid below), so sample i at a depth is the eval's sample i there.
//
//   locret_needle_kept MODEL HEADS ISA BUDGET POOL LENGTH DEPTH SAMPLES
//                      [compact|original] [passkey|niah] [token|word|number]
//
// For each sample: the token indices that overlap the key (passkey's pass key, niah's number) in the
// prompt (every occurrence), then per layer how many of them are held by each KV head (G marks a layer
// without a sliding window of its own), and for each such global layer where KV head 0's rows lie, by
// eighth of the prompt.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "eval/task.h"
#include "kv/locret_kv.h"
#include "locret/head_scorer.h"
#include "runtime/model_files.h"
#include "runtime/session.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/prompt_tokens.h"

namespace {

using namespace kvtier;

int run(int argc, char** argv) {
  if (argc < 9 || argc > 12) {
    std::fprintf(
        stderr,
        "usage: %s MODEL HEADS ISA BUDGET POOL LENGTH DEPTH SAMPLES [compact|original] [passkey|niah] "
        "[token|word|number]\n"
        "  e.g. %s models/gemma-3-270m-q4_k_m.gguf HEADS avx2 512 7 4096 0.75 6\n",
        argv[0], argv[0]);
    return 2;
  }
  const std::string model_path = argv[1], heads = argv[2], isa_name = argv[3];
  const int64_t budget = std::stoll(argv[4]), pool = std::stoll(argv[5]), length = std::stoll(argv[6]);
  const double depth = std::stod(argv[7]);
  const int n_samples = std::stoi(argv[8]);
  const std::string positions = argc >= 10 ? argv[9] : "compact";
  const std::string task = argc >= 11 ? argv[10] : "passkey";
  const policy::LocretSpan span = policy::parse_locret_span(argc == 12 ? argv[11] : "token");
  if (task != "passkey" && task != "niah") {
    std::fprintf(stderr, "locret_needle_kept: TASK '%s' is not passkey or niah\n", task.c_str());
    return 2;
  }
  std::optional<cpu::Isa> isa;
  for (const cpu::Isa i : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512})
    if (cpu::isa_name(i) == isa_name) isa = i;
  if (!isa || !cpu::isa_supported(*isa)) {
    std::fprintf(stderr, "locret_needle_kept: ISA '%s' is not one this CPU runs (scalar, avx2, avx512)\n",
                 isa_name.c_str());
    return 2;
  }
  const auto model = runtime::load_model(model_path, runtime::LoadOptions{.cpu_isa = isa});
  const auto& tok = *model->tokenizer;
  const std::optional<tokenizer::ChatTemplate> tmpl = tokenizer::chat_template_for(tok.vocab());
  auto prompt_tokens = [&](const eval::Prompt& p) {  // as kvtier eval feeds a prompt
    return tokenizer::one_turn_prompt_tokens(tok, tmpl, p.user, p.answer_prefix);
  };
  eval::GridSpec grid;
  grid.lengths = {length};
  grid.depths = {depth};
  grid.samples = n_samples;
  const auto samples = eval::make_samples(
      task == "niah" ? eval::TaskKind::kNiah : eval::TaskKind::kPasskey, grid,
      [&](const eval::Prompt& p) { return static_cast<int64_t>(prompt_tokens(p).size()); });
  const auto scorer = locret::load_head_scorer(heads, model_path, model->config);
  for (const eval::Sample& s : samples) {
    const auto toks = prompt_tokens(s.prompt);
    std::string text;  // the prompt as its tokens' pieces, each token's first byte in start[]
    std::vector<size_t> start;
    for (const auto& t : toks) {
      start.push_back(text.size());
      text += tok.decode(std::span(&t, 1));
    }
    start.push_back(text.size());
    const std::string& key = s.expected.at(0);
    std::vector<int64_t> needle;
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
      for (size_t i = 0; i + 1 < start.size(); ++i) {
        if (start[i] < at + key.size() && start[i + 1] > at) needle.push_back(static_cast<int64_t>(i));
      }
    }
    runtime::SessionOptions o;
    o.n_ctx = length;
    o.chunk = 512;
    o.threads = 2;
    o.isa = isa;
    o.kv_placement.retention = policy::Retention::kLocret;
    o.kv_placement.knobs.budget = budget;
    o.kv_placement.knobs.locret_pool = pool;
    o.kv_placement.knobs.locret_span = span;
    o.kv_placement.knobs.locret_positions = policy::parse_locret_positions(positions);
    o.kv_placement.scorer = scorer;
    runtime::Session session(*model, o);
    session.prefill(toks);
    const auto& kv = dynamic_cast<const kv::LocretKv&>(session.kv());
    const kv::KvGeometry& geo = kv.geometry();
    std::printf("depth %.2f sample %d, key %s: %zu prompt tokens; the key's tokens", s.depth, s.index,
                key.c_str(), toks.size());
    for (const int64_t i : needle) std::printf(" %lld", static_cast<long long>(i));
    std::printf("\n  held per layer (of %zu, per KV head):", needle.size());
    for (uint32_t l = 0; l < geo.n_layer(); ++l) {
      std::printf(" %s", geo.window_of(l) > 0 ? "" : "G");
      for (uint32_t h = 0; h < geo.n_head_kv[l]; ++h) {
        int held = 0;
        for (int64_t r = 0; r < kv.rows(0); ++r) held += std::ranges::count(needle, kv.position(0, l, h, r));
        std::printf("%s%d", h ? "," : "", held);
      }
    }
    std::printf("\n");
    for (uint32_t l = 0; l < geo.n_layer(); ++l) {
      if (geo.window_of(l) > 0) continue;
      int eighth[8] = {};
      for (int64_t r = 0; r < kv.rows(0); ++r)
        ++eighth[std::min<int64_t>(7, kv.position(0, l, 0, r) * 8 / static_cast<int64_t>(toks.size()))];
      std::printf("  layer %u: %lld rows, by eighth of the prompt:", l, static_cast<long long>(kv.rows(0)));
      for (const int e : eighth) std::printf(" %d", e);
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "locret_needle_kept: %s\n", e.what());
    return 1;
  }
}
