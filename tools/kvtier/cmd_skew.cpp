// kvtier skew -m MODEL -o SKEW.gguf [--text FILE] [--tokens N] [--ratio R]
// kvtier skew -m MODEL --check SKEW.gguf [--text FILE] [--tokens N] [--skip N]
//
// InfiniGen's offline step (spec infinigen.md §4): the skewing matrices per layer and KV head from
// the post-RoPE queries of a sample text, written to a sidecar GGUF tied to the model's hash. --check
// loads such a file for the model (hash and shapes checked) and measures A1 (skewed scores equal the
// original) and A3 (energy in the top partial columns, skewed vs not) on held-out tokens.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "core/content_hash.h"
#include "core/error.h"
#include "run_common.h"
#include "runtime/skew_sample.h"
#include "runtime/speculation_check.h"

namespace kvtier::cli {
namespace {

// Debian's base-files ships it on every Debian system: a long English text (about 8K tokens).
constexpr const char* kDefaultText = "/usr/share/common-licenses/GPL-3";

struct SkewArgs {
  std::string model;
  std::string output;
  std::string check;
  std::string text = kDefaultText;
  int64_t tokens = 2048;
  int64_t skip = -1;  // --check: tokens of the text skipped first (-1: the file's sample size)
  double ratio = 0.3;
  policy::InfinigenParams spec;  // --check: the speculation's alpha and budget
  int threads = 0;
  bool json = false;
};

void say(const std::string& line) {
  std::fprintf(stderr, "[skew] %s\n", line.c_str());
  std::fflush(stderr);
}

// The text's tokens [skip, skip + n); fewer when the text ends (at least `min_tokens` or an error).
std::vector<model::TokenId> text_tokens(const runtime::LoadedModel& m, const SkewArgs& a, int64_t skip) {
  const std::string text = read_text_file(a.text);
  const auto all = m.tokenizer->encode(text);
  const auto n_all = static_cast<int64_t>(all.size());
  constexpr int64_t kMinTokens = 16;
  if (n_all - skip < kMinTokens)
    fail(ErrorKind::kInvalidArgument, "{} has {} tokens; {} are needed ({} skipped, at least {} used)",
         a.text, n_all, skip + kMinTokens, skip, kMinTokens);
  const int64_t n = std::min(a.tokens, n_all - skip);
  return {all.begin() + skip, all.begin() + skip + n};
}

runtime::SkewOptions skew_options(const SkewArgs& a) {
  runtime::SkewOptions o;
  o.partial_ratio = a.ratio;
  o.threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return o;
}

std::vector<runtime::LayerSamples> collect(const runtime::LoadedModel& m,
                                           const std::vector<model::TokenId>& tokens,
                                           const runtime::SkewOptions& o) {
  say(fmt::format("forward pass over {} tokens", tokens.size()));
  ProgressBar bar("skew: forward", stderr_is_tty());
  auto samples = runtime::collect_samples(m, tokens, o, [&](runtime::SkewStage, int64_t d, int64_t t) {
    throw_if_interrupted();
    bar.update(d, t);
  });
  bar.finish();
  return samples;
}

int run_skew(const SkewArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  if (a.output.empty() == a.check.empty())
    fail(ErrorKind::kInvalidArgument,
         "kvtier skew needs exactly one of -o (write a skew file) and --check FILE");
  const auto m = runtime::load_model(a.model);
  const runtime::SkewOptions o = skew_options(a);
  if (!a.check.empty()) {
    say(fmt::format("checking {} against {}", a.check, a.model));
    const skew::SkewSet set = runtime::load_skew_for(*m, a.check);
    const int64_t skip = a.skip >= 0 ? a.skip : set.sample_tokens;
    const auto tokens = text_tokens(*m, a, skip);
    runtime::SkewOptions ol = o;
    ol.lookahead = true;
    const auto held = collect(*m, tokens, ol);
    say("measuring A1 and A3 per layer");
    const auto checks = runtime::check_skew(set, held);
    say(fmt::format("speculation on the second half (alpha {}, budget {}, group rule {})", a.spec.alpha,
                    a.spec.budget, policy::infinigen_group_name(a.spec.group)));
    // The look-ahead (what the runtime does) and layer l's own query (its upper bound).
    nlohmann::json spec_json;
    std::string spec_text;
    for (const bool ahead : {true, false}) {
      const auto spec = runtime::check_speculation(m->config, set, held, a.spec, ahead);
      double fetched = 0.0, recall = 0.0, min_recall = 1.0;
      nlohmann::json spec_layers = nlohmann::json::array();
      for (const auto& s : spec) {
        fetched += s.fetched / static_cast<double>(spec.size());
        recall += s.recall / static_cast<double>(spec.size());
        min_recall = std::min(min_recall, s.min_recall);
        spec_layers.push_back({{"layer", s.layer},
                               {"fetched", s.fetched},
                               {"n_sel", s.n_sel},
                               {"recall", s.recall},
                               {"min_recall", s.min_recall}});
      }
      spec_json[ahead ? "lookahead" : "own_query"] = {{"mean_fetched", fetched},
                                                      {"mean_recall", recall},
                                                      {"min_recall", min_recall},
                                                      {"layers", spec_layers}};
      spec_text += fmt::format(
          "speculation ({}; layers >= 2 without a window, alpha {}, budget {}): {:.1f} % of the rows "
          "fetched, {:.4f} of the "
          "attention mass kept (worst step and head {:.4f})\n",
          ahead ? "look-ahead from layer l-1" : "layer l's own query", a.spec.alpha, a.spec.budget,
          100.0 * fetched, recall, min_recall);
    }
    spec_json["alpha"] = a.spec.alpha;
    spec_json["budget"] = a.spec.budget;
    spec_json["group"] = policy::infinigen_group_name(a.spec.group);
    double worst = 0.0, plain = 0.0, skewed = 0.0;
    nlohmann::json layers = nlohmann::json::array();
    for (size_t l = 0; l < checks.size(); ++l) {
      worst = std::max(worst, checks[l].a1_error);
      plain += checks[l].share_plain / static_cast<double>(checks.size());
      skewed += checks[l].share_skewed / static_cast<double>(checks.size());
      layers.push_back({{"layer", l},
                        {"a1_error", checks[l].a1_error},
                        {"share_plain", checks[l].share_plain},
                        {"share_skewed", checks[l].share_skewed},
                        {"q_share_plain", checks[l].q_share_plain},
                        {"q_share_skewed", checks[l].q_share_skewed},
                        {"q_energy_plain", checks[l].q_energy_plain},
                        {"q_energy_skewed", checks[l].q_energy_skewed}});
    }
    if (a.json) {
      nlohmann::json j = {{"skew_file", a.check},
                          {"model_hash", set.model_hash},
                          {"tokens", tokens.size()},
                          {"skip", skip},
                          {"partial_columns", set.partial_columns},
                          {"max_a1_error", worst},
                          {"mean_share_plain", plain},
                          {"mean_share_skewed", skewed},
                          {"layers", layers},
                          {"speculation", spec_json}};
      std::cout << j.dump() << "\n";
    } else {
      std::cout << fmt::format(
          "{}: {} layers, {} held-out tokens (after {} skipped)\n"
          "A1 max |QK^T - Q~K~^T| / max |QK^T| = {:.3g}\n"
          "A3 share of sum |Q|+|K| in the top {} of {} columns: {:.3f} unskewed, {:.3f} skewed (mean over "
          "layers)\n",
          a.check, checks.size(), tokens.size(), skip, worst, set.partial_columns, set.head_dim, plain,
          skewed);
      std::cout << spec_text;
    }
    return 0;
  }
  const auto tokens = text_tokens(*m, a, 0);
  const auto samples = collect(*m, tokens, o);
  say(fmt::format("SVD of {} layers' queries (LAPACK)", samples.size()));
  ProgressBar bar("skew: matrices", stderr_is_tty());
  skew::SkewSet set =
      runtime::compute_skew(*m, samples, a.ratio, [&](runtime::SkewStage, int64_t d, int64_t t) {
        throw_if_interrupted();
        bar.update(d, t);
      });
  bar.finish();
  set.model_hash = file_xxh3_tag(a.model);
  set.sample_source = a.text;
  say(fmt::format("writing {}", a.output));
  skew::write_skew(set, a.output);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) {
    nlohmann::json j = {{"output", a.output},
                        {"model_hash", set.model_hash},
                        {"layers", set.layers.size()},
                        {"head_dim", set.head_dim},
                        {"partial_columns", set.partial_columns},
                        {"tokens", set.sample_tokens},
                        {"text", a.text},
                        {"seconds", secs}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << fmt::format(
        "wrote {}: {} layers, head size {}, {} partial columns, {} sample tokens of {} ({:.1f} s)\n",
        a.output, set.layers.size(), set.head_dim, set.partial_columns, set.sample_tokens, a.text, secs);
  }
  return 0;
}

}  // namespace

void add_skew(CLI::App& app, Runner& run) {
  auto a = std::make_shared<SkewArgs>();
  CLI::App* cmd = app.add_subcommand("skew",
                                     "InfiniGen's offline step: skewing matrices per layer and KV head (SVD "
                                     "of sample queries) to a sidecar GGUF");
  cmd->add_option("-m,--model", a->model, "model GGUF file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", a->output, "skew file to write")->check(output_file());
  cmd->add_option("--check", a->check,
                  "instead: load this skew file for the model and measure A1/A3 on held-out text")
      ->check(CLI::ExistingFile);
  cmd->add_option("--text", a->text, "sample text (default: Debian's GPL-3 text)")
      ->capture_default_str()
      ->check(CLI::ExistingFile);
  cmd->add_option("--tokens", a->tokens, "tokens of the text to use")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--skip", a->skip, "--check: tokens skipped first (default: the skew file's sample size)")
      ->check(non_negative());
  cmd->add_option("--ratio", a->ratio, "partial ratio r of the offline column sets (floor(r*d) columns)")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  cmd->add_option("--alpha", a->spec.alpha, "--check: speculation threshold margin (scaled logits)")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--budget", a->spec.budget, "--check: speculation cap as a share of the tokens")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  cmd->add_option_function<std::string>(
         "--group", [a](const std::string& v) { a->spec.group = policy::parse_infinigen_group(v); },
         "--check: how a KV head's query heads combine their scores (relative or max; see run "
         "--infinigen-group)")
      ->default_str(std::string(policy::infinigen_group_name(a->spec.group)));
  cmd->add_option("-t,--threads", a->threads, "threads (0: all cores)")->check(non_negative());
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([&run, a] { run = [a] { return run_skew(*a); }; });
}

}  // namespace kvtier::cli
