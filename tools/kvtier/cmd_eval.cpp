// kvtier eval TASK[,TASK...] -m MODEL [--kv-policy P1,P2,...] [--lengths 1k,2k,...] [--depths 0,0.5,1]
//             [--samples N] [--seed S] [--json FILE] [--report DIR] [--text FILE] [--expect-equal]
// Long-context accuracy of KV policies: the src/eval harness run through the generation engine
// (greedy decoding). Progress goes to stderr, one line per sample with an ETA.
// kvtier eval-report RUN.json... [--json FILE] [--report DIR]: one report from several runs' JSON.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "eval/json_out.h"
#include "eval/report.h"
#include "eval/runner.h"
#include "eval/text.h"
#include "eval_common.h"
#include "locret/head_scorer.h"
#include "policy/placement.h"
#include "run_common.h"
#include "runtime/generate.h"
#include "tokenizer/chat_template.h"

namespace kvtier::cli {
namespace {

struct EvalArgs {
  EngineArgs engine;
  std::string tasks;
  std::string policies = "resident";
  std::string lengths = "1k,2k,4k";
  std::string depths = "0,0.25,0.5,0.75,1";
  int samples = 1;
  uint64_t seed = 0;
  std::string json;
  std::string report;
  std::string text;
  std::string chat_template;
  bool no_chat = false;
  bool expect_equal = false;
  std::string command;
};

// The engine behind the harness: one model, one session per policy, greedy decoding.
class ModelEngine final : public eval::Engine {
 public:
  ModelEngine(const runtime::LoadedModel& m, runtime::SessionOptions opts, EngineArgs engine,
              std::optional<tokenizer::ChatTemplate> t)
      : model_(m), opts_(opts), engine_(std::move(engine)), tmpl_(t) {}

  std::vector<int32_t> prompt_tokens(const eval::Prompt& p) const {
    return eval_prompt_tokens(model_, tmpl_, p);
  }
  int64_t count_tokens(const eval::Prompt& p) override {
    return static_cast<int64_t>(prompt_tokens(p).size());
  }
  std::vector<int32_t> tokenize(std::string_view text) override {
    return model_.tokenizer->encode(text, {.add_special = false, .parse_special = false});
  }
  // Every axis of the policy (placement, representation, selection, retention, knobs) comes from the
  // same session_options as `run`'s, so that an eval of a policy runs what `run --kv-policy` runs.
  void use_policy(const std::string& name) override {
    EngineArgs e = engine_;
    e.kv_policy = name;
    const policy::KvPolicy kp = kv_policy_of(e, name);
    e = engine_for(e, kp);
    e.locret_heads.clear();  // loaded once below, for every locret policy of the run
    runtime::SessionOptions o = session_options(e, model_.config, opts_.n_ctx, LocretHeads::kIfGiven);
    o.n_ctx = opts_.n_ctx;
    if (kp.retention == policy::Retention::kLocret) {
      if (!locret_scorer_)
        locret_scorer_ = locret::load_head_scorer(engine_.locret_heads, engine_.model, model_.config);
      o.kv_placement.scorer = locret_scorer_;
    }
    session_.reset();
    session_ = std::make_unique<runtime::Session>(model_, o);
  }
  std::string generate(const eval::Prompt& p, int max_new_tokens) override {
    throw_if_interrupted();
    session_->truncate(0);
    const auto prompt = prompt_tokens(p);
    runtime::Sampler sampler(runtime::SamplerParams{}, model_.config.n_vocab);  // greedy
    runtime::GenerateOptions g;
    g.max_tokens = max_new_tokens;
    g.interrupted = [] { return interrupted(); };
    std::vector<runtime::TokenId> history;
    return runtime::generate(*session_, sampler, prompt, g, history).text;
  }
  void evaluate(std::span<const int32_t> tokens,
                const std::function<void(int64_t, std::span<const float>)>& fn) override {
    throw_if_interrupted();
    session_->truncate(0);
    session_->evaluate(tokens, fn);
  }
  const runtime::Session* session() const { return session_.get(); }

 private:
  const runtime::LoadedModel& model_;
  runtime::SessionOptions opts_;
  EngineArgs engine_;
  std::optional<tokenizer::ChatTemplate> tmpl_;
  std::unique_ptr<runtime::Session> session_;
  std::shared_ptr<kv::UnitScorer> locret_scorer_;
};

// The command that reproduces the run (every option that changes results, spelled out).
std::string command_line(const EvalArgs& a) {
  std::string c = fmt::format("kvtier eval {} -m {} --kv-policy {} --lengths {}", a.tasks, a.engine.model,
                              a.policies, a.lengths);
  if (!a.depths.empty()) c += " --depths " + a.depths;
  c += fmt::format(" --samples {} --seed {}", a.samples, a.seed);
  if (a.engine.ctx > 0) c += fmt::format(" --ctx {}", a.engine.ctx);
  if (a.engine.chunk > 0) c += fmt::format(" --chunk {}", a.engine.chunk);
  if (!a.engine.kv_type.empty()) c += " --kv-type " + a.engine.kv_type;
  if (!a.engine.isa.empty()) c += " --isa " + a.engine.isa;
  if (a.engine.group > 0) c += fmt::format(" --group {}", a.engine.group);
  if (a.engine.static_heads > 0) c += fmt::format(" --static-heads {}", a.engine.static_heads);
  if (!a.engine.skew.empty()) c += " --skew " + a.engine.skew;
  if (!a.engine.locret_heads.empty()) c += " --locret-heads " + a.engine.locret_heads;
  c += knob_flags_text(a.engine.knobs);
  if (!a.text.empty()) c += " --text " + a.text;
  if (!a.chat_template.empty()) c += " --chat-template " + a.chat_template;
  if (a.no_chat) c += " --no-chat";
  return c;
}

int run_eval_cmd(const EvalArgs& a) {
  eval::EvalPlan plan;
  plan.tasks = eval::parse_task_list(a.tasks);
  for (const std::string& p : split_commas(a.policies)) plan.policies.push_back(p);
  (void)kv_policy_list(a.engine, a.policies);  // unknown or repeated policies are errors before loading
  plan.grid.lengths = parse_lengths(a.lengths);
  plan.grid.depths = parse_depths(a.depths);
  plan.grid.samples = a.samples;
  plan.grid.seed = a.seed;
  if (!a.text.empty()) plan.ppl_text = read_text_file(a.text);

  const auto model = runtime::load_model(a.engine.model, load_options(a.engine));
  int64_t max_len = 0;
  for (int64_t l : plan.grid.lengths) max_len = std::max(max_len, l);
  const int64_t train = model->config.n_ctx_train;
  if (train > 0 && max_len > train)
    std::fprintf(stderr, "kvtier eval: note: length %lld is beyond the model's trained context %lld\n",
                 static_cast<long long>(max_len), static_cast<long long>(train));
  runtime::SessionOptions opts = session_options(a.engine, model->config, max_len);
  if (opts.n_ctx < max_len)
    fail(ErrorKind::kInvalidArgument, "--ctx {} is smaller than the longest length {}", opts.n_ctx, max_len);
  std::optional<tokenizer::ChatTemplate> tmpl;
  if (!a.no_chat) {
    tmpl = tokenizer::chat_template_for(
        model->tokenizer->vocab(),
        a.chat_template.empty() ? std::nullopt : std::optional<std::string_view>(a.chat_template));
  }
  ModelEngine engine(*model, opts, a.engine, tmpl);

  eval::RunInfo info;
  info.model = a.engine.model;
  info.model_name = std::filesystem::path(a.engine.model).stem().string();
  info.commit = source_commit();
  info.machine = machine_description();
  info.command = a.command;
  info.options = fmt::format("ctx={} chunk={} threads={} kv_type={} chat_template={}", opts.n_ctx, opts.chunk,
                             opts.threads, a.engine.kv_type,
                             tmpl ? std::string(tokenizer::chat_template_name(*tmpl)) : "none (raw text)");
  info.started = now_iso();
  info.seed = a.seed;
  info.policies = plan.policies;
  info.tasks = plan.tasks;
  info.lengths = plan.grid.lengths;
  info.depths = plan.grid.depths;
  info.samples = a.samples;
  info.haystack = fmt::format("generated: passkey filler (passkey), {} (niah, vt, ppl); pseudo-words (cwe){}",
                              eval::ppl_default_source(), a.text.empty() ? "" : "; ppl text: " + a.text);

  const auto t0 = std::chrono::steady_clock::now();
  const eval::Results results = eval::run_eval(engine, plan, [](const eval::Progress& p) {
    std::fprintf(stderr, "[eval %lld/%lld] %s | %s elapsed, ETA %s\n", static_cast<long long>(p.done),
                 static_cast<long long>(p.total), p.current.c_str(), duration_text(p.elapsed_s).c_str(),
                 duration_text(p.eta_s).c_str());
  });
  info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!a.json.empty()) eval::write_json_file(a.json, eval::results_json(info, results));
  if (!a.report.empty()) eval::write_report(a.report, info, results);
  for (const eval::Cell& c : results.overall()) {
    std::printf("%-10s %-10s %s %.4f\n", std::string(eval::task_name(c.task)).c_str(), c.policy.c_str(),
                c.task == eval::TaskKind::kPpl ? "perplexity" : "accuracy", c.value);
  }
  int status = 0;
  for (size_t i = 1; i < plan.policies.size(); ++i) {
    const auto mism = eval::compare_policies(results, plan.policies[0], plan.policies[i]);
    std::printf("%s vs %s: %zu of the samples differ\n", plan.policies[i].c_str(), plan.policies[0].c_str(),
                mism.size());
    for (const auto& m : mism) {
      std::fprintf(stderr, "  %s %lld d=%.2f #%d: '%s' vs '%s'\n",
                   std::string(eval::task_name(m.task)).c_str(), static_cast<long long>(m.length), m.depth,
                   m.index, m.answer_a.c_str(), m.answer_b.c_str());
    }
    if (a.expect_equal && !mism.empty()) status = 1;
  }
  return status;
}

// kvtier eval-report RUN.json... [--json FILE] [--report DIR]: one report from the JSON files of
// earlier runs (a grid run in parts), without a model.
int run_eval_report_cmd(const std::vector<std::string>& inputs, const std::string& json,
                        const std::string& report) {
  std::vector<eval::RunRecord> runs;
  for (const std::string& path : inputs) runs.push_back(eval::read_json_file(path));
  const eval::RunRecord merged = eval::merge_runs(runs);
  if (!json.empty()) eval::write_json_file(json, eval::results_json(merged.info, merged.results));
  if (!report.empty()) eval::write_report(report, merged.info, merged.results);
  std::printf("%zu runs, %zu samples\n", runs.size(), merged.results.samples().size());
  for (const eval::Cell& c : merged.results.overall()) {
    std::printf("%-10s %-10s %s %.4f\n", std::string(eval::task_name(c.task)).c_str(), c.policy.c_str(),
                c.task == eval::TaskKind::kPpl ? "perplexity" : "accuracy", c.value);
  }
  return 0;
}

}  // namespace

void add_eval(CLI::App& app, Runner& run) {
  {
    struct ReportArgs {
      std::vector<std::string> inputs;
      std::string json, report;
    };
    auto r = std::make_shared<ReportArgs>();
    CLI::App* cmd = app.add_subcommand(
        "eval-report", "One eval report from the JSON files of several runs (a grid run in parts), no model");
    cmd->add_option("runs", r->inputs, "JSON files written by kvtier eval --json")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--json", r->json, "write the merged samples, cells and metadata to this JSON file");
    cmd->add_option("--report", r->report, "write README.md tables and SVG plots into this directory");
    cmd->callback([&run, r] { run = [r] { return run_eval_report_cmd(r->inputs, r->json, r->report); }; });
  }

  auto a = std::make_shared<EvalArgs>();
  CLI::App* cmd =
      app.add_subcommand("eval", "Long-context accuracy of KV policies (ppl, passkey, niah, vt, cwe)");
  cmd->add_option(
         "task", a->tasks,
         "task or comma-separated tasks: " + eval::task_names() + "; 'niah-all' = the niah variants; 'all'")
      ->required();
  add_engine_flags(cmd, a->engine, /*with_policy=*/false);
  cmd->add_option(
         "--kv-policy", a->policies,
         "KV policies to compare, comma-separated (the first is the reference): presets or specs such as "
         "layer+sliding (`kvtier policies` lists them)")
      ->default_val(a->policies);
  cmd->add_option("--lengths", a->lengths, "context lengths in tokens (prompt + answer), e.g. 1k,2k,4k")
      ->default_val(a->lengths);
  cmd->add_option("--depths", a->depths, "needle depths in [0, 1] (passkey, niah)")->default_val(a->depths);
  cmd->add_option("--samples", a->samples, "samples per cell (ppl: windows per length)")
      ->default_val(a->samples)
      ->check(positive());
  cmd->add_option("--seed", a->seed, "seed of the generated prompts")->default_val(a->seed);
  cmd->add_option("--json", a->json, "write every sample, the cells and run metadata to this JSON file");
  cmd->add_option("--report", a->report, "write README.md tables and SVG plots into this directory");
  cmd->add_option("--text", a->text, "ppl: evaluate this text file instead of the generated essay");
  cmd->add_option("--chat-template", a->chat_template, "chat template name (default: the model's)");
  cmd->add_flag("--no-chat", a->no_chat, "send prompts as raw text, without the chat template");
  cmd->add_flag("--expect-equal", a->expect_equal,
                "exit 1 if any policy's answers or NLLs differ from the first policy's (exact policies)");
  cmd->callback([&run, a] {
    a->command = command_line(*a);
    run = [a] { return run_eval_cmd(*a); };
  });
}

}  // namespace kvtier::cli
