// kvtier locret-data -m MODEL -o OUT.jsonl [--samples N] [--lengths 1k,2k] [--tasks ...] [--text FILE]...
//
// Training data for `kvtier train-locret`: long prompts whose answers are spans of the prompt, from
//   - the eval harness's task generators (passkey, niah and its RULER variants, vt, cwe), drawn
//     with seeds far from the ones `kvtier eval` uses, and
//   - real prose in text files (by default the licence texts every Debian system ships in
//     /usr/share/common-licenses, package base-files): sentence recall and a made-up fact hidden
//     in the prose (locret/prose_tasks.h).
// Every line records its source. Lengths are fitted with the model's tokenizer and chat template.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "eval/rng.h"
#include "eval/task.h"
#include "eval_common.h"
#include "locret/prose_tasks.h"
#include "run_common.h"

namespace kvtier::cli {
namespace {

constexpr const char* kDefaultTexts[] = {
    "/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
    "/usr/share/common-licenses/MPL-2.0", "/usr/share/common-licenses/GFDL-1.3",
    "/usr/share/common-licenses/LGPL-2.1"};
// `kvtier eval` draws its samples from small seeds; these are far from them.
constexpr uint64_t kSeedBase = 0x10c4e7000000ull;

struct LocretDataArgs {
  std::string model, out, lengths = "1k,2k", tasks = "passkey,niah,niah-mk,niah-mv,niah-mq,vt,cwe";
  std::vector<std::string> texts;
  int64_t samples = 400;
  double prose_share = 0.5;
  uint64_t seed = 0;
  bool raw = false;
};

int write_locret_data(const LocretDataArgs& a, const std::string& tmp);

int run_locret_data(const LocretDataArgs& a) {
  const std::string tmp = a.out + ".tmp";
  try {
    return write_locret_data(a, tmp);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

int write_locret_data(const LocretDataArgs& a, const std::string& tmp) {
  if (!(a.prose_share >= 0.0 && a.prose_share <= 1.0))
    fail(ErrorKind::kInvalidArgument, "--prose-share must be in [0, 1]");
  const auto model = runtime::load_model(a.model);
  std::optional<tokenizer::ChatTemplate> tmpl;
  if (!a.raw) tmpl = tokenizer::chat_template_for(model->tokenizer->vocab());
  const auto lengths = parse_lengths(a.lengths);
  const auto tasks = eval::parse_task_list(a.tasks);
  for (auto t : tasks) {
    if (t == eval::TaskKind::kPpl)
      fail(ErrorKind::kInvalidArgument, "--tasks: ppl has no answer to train on");
  }
  const auto count = [&](const eval::Prompt& p) {
    return static_cast<int64_t>(eval_prompt_tokens(*model, tmpl, p).size());
  };
  // Texts.
  std::vector<std::string> paths = a.texts;
  if (paths.empty()) {
    for (const char* p : kDefaultTexts) {
      if (std::filesystem::exists(p)) paths.emplace_back(p);
    }
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> texts;  // (name, sentences)
  for (const auto& p : paths) {
    auto s = locret::split_sentences(read_text_file(p));
    if (s.size() < 8) fail(ErrorKind::kInvalidArgument, "{}: only {} usable sentences", p, s.size());
    texts.emplace_back(std::filesystem::path(p).filename().string(), std::move(s));
  }
  const auto n_prose = static_cast<int64_t>(std::llround(a.prose_share * static_cast<double>(a.samples)));
  if (n_prose > 0 && texts.empty())
    fail(ErrorKind::kInvalidArgument, "no prose texts found: give --text FILE or --prose-share 0");

  std::ofstream out(tmp, std::ios::trunc);
  if (!out) fail(ErrorKind::kIo, "cannot write {}", tmp);
  ProgressBar bar("locret-data", stderr_is_tty());
  for (int64_t i = 0; i < a.samples; ++i) {
    const uint64_t seed = kSeedBase + a.seed * 1000003ull + static_cast<uint64_t>(i);
    const int64_t length = lengths[static_cast<size_t>(i) % lengths.size()];
    nlohmann::json j;
    if (i < n_prose) {
      const auto& [name, sentences] =
          texts[static_cast<size_t>(i / static_cast<int64_t>(lengths.size())) % texts.size()];
      const bool recall = (i / static_cast<int64_t>(lengths.size() * texts.size())) % 2 == 0;
      // Fit the prompt to the length (the answer's tokens and a margin kept free), twice refined.
      const int64_t budget = length - 96;
      int64_t chars = budget * 4;
      locret::QaText q;
      for (int pass = 0; pass < 3; ++pass) {
        q = recall ? locret::sentence_recall(sentences, chars, seed)
                   : locret::prose_needle(sentences, chars, seed);
        const int64_t n = count({q.prompt, ""});
        if (n <= budget && n >= budget * 9 / 10) break;
        chars = std::max<int64_t>(200, chars * budget / std::max<int64_t>(n, 1) * 97 / 100);
      }
      j = {{"prompt", q.prompt},
           {"answer", q.answer},
           {"source", fmt::format("{}:{}", recall ? "recall" : "needle", name)},
           {"length", length}};
    } else {
      eval::Rng rng(seed);
      const eval::TaskKind t = tasks[static_cast<size_t>(i - n_prose) % tasks.size()];
      const double depth = eval::task_has_depth(t) ? rng.unit() : -1.0;
      const eval::Sample s = eval::make_sample(t, length, eval::task_has_depth(t) ? 0 : -1, depth,
                                               static_cast<int>(i), seed, count);
      std::string answer = s.prompt.answer_prefix;
      for (size_t k = 0; k < s.expected.size(); ++k) answer += (k == 0 ? " " : ", ") + s.expected[k];
      answer += ".";
      j = {{"prompt", s.prompt.user},
           {"answer", answer},
           {"source", std::string(eval::task_name(t))},
           {"length", length}};
    }
    out << j.dump() << "\n";
    bar.update(i + 1, a.samples);
    throw_if_interrupted();
  }
  bar.finish();
  out.close();
  if (!out) fail(ErrorKind::kIo, "cannot write {}", tmp);
  std::filesystem::rename(tmp, a.out);
  std::fprintf(stderr, "wrote %s: %lld samples (%lld from prose in %zu texts, %lld from eval tasks)\n",
               a.out.c_str(), static_cast<long long>(a.samples), static_cast<long long>(n_prose),
               texts.size(), static_cast<long long>(a.samples - n_prose));
  return 0;
}

}  // namespace

void add_locret_data(CLI::App& app, Runner& run) {
  auto a = std::make_shared<LocretDataArgs>();
  CLI::App* cmd =
      app.add_subcommand("locret-data",
                         "Build training data (JSONL) for train-locret: eval-harness tasks (passkey, niah "
                         "variants, vt, cwe) and QA "
                         "over real prose (default: the licence texts in /usr/share/common-licenses)");
  cmd->add_option("-m,--model", a->model, "GGUF model whose tokenizer and chat template fit the lengths")
      ->required();
  cmd->add_option("-o,--out", a->out, "output JSONL file")->required()->check(output_file());
  cmd->add_option("--samples", a->samples, "samples to write")->check(positive())->capture_default_str();
  cmd->add_option("--lengths", a->lengths, "prompt lengths in tokens, used in turn")->capture_default_str();
  cmd->add_option("--tasks", a->tasks, "eval tasks to draw from")->capture_default_str();
  cmd->add_option("--text", a->texts, "prose text files (repeatable; default: Debian's licence texts)");
  cmd->add_option("--prose-share", a->prose_share, "share of samples from prose")->capture_default_str();
  cmd->add_option("--seed", a->seed, "seed (samples differ from kvtier eval's whatever the seed)")
      ->capture_default_str();
  cmd->add_flag("--raw", a->raw, "fit lengths without the chat template (train-locret --raw)");
  cmd->callback([&run, a] { run = [a] { return run_locret_data(*a); }; });
}

}  // namespace kvtier::cli
