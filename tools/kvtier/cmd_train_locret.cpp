// kvtier train-locret -m MODEL -o HEADS.gguf [--data FILE.jsonl | --fixture-samples N] [--steps N] ...
// kvtier locret-fixture -o MODEL.gguf
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <utility>

#include "cli_util.h"
#include "commands.h"
#include "core/content_hash.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "locret/data_jsonl.h"
#include "locret/head_file.h"
#include "locret/match_fixture.h"
#include "locret/train_loop.h"
#include "runtime/model_files.h"

namespace kvtier::cli {
namespace {

struct TrainLocretArgs {
  std::string model, out, data, checkpoint, chat_template, isa;
  int64_t fixture_samples = 0;
  int64_t steps = 600;
  int64_t warmup = -1;  // -1: 2/3 of the steps
  double lr = 5e-4;
  int64_t d_m = 256;
  double alpha = 0.0025;
  std::string smooth = "sum";
  locret::LabelTarget labels = locret::LabelTarget::kRaw;
  double clip = 0.5;
  uint64_t seed = 0;
  int64_t max_len = 10240;
  int64_t max_tokens = 4096;
  int64_t held_out = -1;  // -1: 10% of the samples, at most 20
  int64_t eval_every = 50;
  int64_t checkpoint_every = 50;
  int64_t log_every = 10;
  int threads = 0;
  bool resume = false;
  bool raw = false;
};

// Everything that must match for a checkpoint to be resumed.
std::string config_string(const TrainLocretArgs& a, int64_t warmup, const std::string& data_id) {
  return fmt::format(
             "steps={} warmup={} lr={} d_m={} alpha={} smooth={} clip={} seed={} max_len={} max_tokens={} "
             "held_out={} "
             "data={}",
             a.steps, warmup, a.lr, a.d_m, a.alpha, a.smooth, a.clip, a.seed, a.max_len, a.max_tokens,
             a.held_out, data_id) +
         (a.labels == locret::LabelTarget::kCentered ? " labels=centered" : "");
}

std::string provenance_value(const locret::HeadFileMeta& m, const std::string& key) {
  for (const auto& [k, v] : m.provenance) {
    if (k == key) return v;
  }
  return {};
}

int run_train_locret(const TrainLocretArgs& a) {
  if (a.steps == 0) {  // untrained heads (seeded N(0, 0.02)): for tests and the degenerate runs
    const auto model = runtime::load_model(a.model);
    locret::HeadFileMeta meta;
    meta.model_hash = file_xxh3_tag(a.model);
    meta.model_name =
        model->file->opt_string("general.name").value_or(std::filesystem::path(a.model).filename());
    meta.provenance = {{"trainer", "kvtier train-locret --steps 0"},
                       {"config", fmt::format("untrained: N(0, 0.02) seed={} d_m={}", a.seed, a.d_m)}};
    locret::save_heads(
        a.out, locret::RetainingHeads::random(locret::head_shapes(model->config, a.d_m), a.seed), meta);
    std::fprintf(stderr, "wrote untrained heads to %s\n", a.out.c_str());
    return 0;
  }
  if (a.data.empty() == (a.fixture_samples == 0))
    fail(ErrorKind::kInvalidArgument, "give training data: --data FILE.jsonl or --fixture-samples N");
  if (a.steps < 1) fail(ErrorKind::kInvalidArgument, "--steps must be at least 1 (0: write untrained heads)");
  const int64_t warmup = a.warmup >= 0 ? a.warmup : a.steps * 2 / 3;
  const auto model = runtime::load_model(a.model);
  std::fprintf(stderr, "hashing %s ...\n", a.model.c_str());
  const std::string hash = file_xxh3_tag(a.model);

  // Data.
  std::vector<locret::Sample> samples;
  std::string data_id;
  if (!a.data.empty()) {
    std::optional<tokenizer::ChatTemplate> tmpl;
    if (!a.raw) {
      tmpl = a.chat_template.empty() ? tokenizer::chat_template_for(model->tokenizer->vocab())
                                     : tokenizer::parse_chat_template(a.chat_template);
    }
    locret::JsonlStats st;
    samples = locret::read_jsonl_samples(a.data, *model->tokenizer, tmpl, a.max_tokens, &st);
    const MappedFile df(a.data);
    data_id =
        fmt::format("{} ({:016x})", std::filesystem::path(a.data).filename().string(), xxh3_64(df.bytes()));
    std::fprintf(
        stderr, "data: %lld samples from %s (%lld lines, %lld over --max-tokens %lld skipped), %s\n",
        static_cast<long long>(st.kept), a.data.c_str(), static_cast<long long>(st.lines),
        static_cast<long long>(st.too_long), static_cast<long long>(a.max_tokens),
        tmpl ? fmt::format("chat template {}", tokenizer::chat_template_name(*tmpl)).c_str() : "raw text");
  } else {
    if (model->config.n_vocab < static_cast<uint32_t>(locret::kMatchVocab))
      fail(ErrorKind::kInvalidArgument, "--fixture-samples needs a vocabulary of at least {} tokens",
           locret::kMatchVocab);
    samples = locret::match_samples(a.fixture_samples, {}, a.seed);
    data_id = fmt::format("match fixture, {} samples, seed {}", a.fixture_samples, a.seed);
    std::fprintf(stderr, "data: %lld match-fixture samples (prompts of 512-2048 tokens)\n",
                 static_cast<long long>(samples.size()));
  }
  int64_t n_held =
      a.held_out >= 0 ? a.held_out : std::min<int64_t>(20, static_cast<int64_t>(samples.size()) / 10);
  if (n_held >= static_cast<int64_t>(samples.size()))
    fail(ErrorKind::kInvalidArgument, "--held-out {} leaves no training samples of {}", n_held,
         samples.size());
  const std::vector<locret::Sample> held(samples.end() - n_held, samples.end());
  samples.resize(samples.size() - static_cast<size_t>(n_held));
  int64_t longest = 2;
  for (const std::vector<locret::Sample>* set : {&std::as_const(samples), &held}) {
    for (const auto& s : *set) longest = std::max<int64_t>(longest, static_cast<int64_t>(s.tokens.size()));
  }

  // Heads and optimiser: fresh, or the checkpoint's.
  TrainLocretArgs cfg_args = a;
  cfg_args.held_out = n_held;
  const std::string config = config_string(cfg_args, warmup, data_id);
  const std::string ckpt = a.checkpoint.empty() ? a.out + ".ckpt" : a.checkpoint;
  locret::HeadFileMeta meta;
  meta.model_hash = hash;
  meta.model_name =
      model->file->opt_string("general.name").value_or(std::filesystem::path(a.model).filename());
  meta.provenance = {{"trainer", "kvtier train-locret"}, {"config", config}};
  locret::RetainingHeads heads;
  locret::OptimizerState state;
  if (a.resume && std::filesystem::exists(ckpt)) {
    locret::HeadFile hf = locret::load_heads(ckpt, hash, model->config);
    if (!hf.optimizer) fail(ErrorKind::kInvalidFile, "{} holds no optimizer state: not a checkpoint", ckpt);
    if (provenance_value(hf.meta, "config") != config)
      fail(ErrorKind::kInvalidArgument,
           "{} was made by another training configuration:\n  {}\nthis run is:\n  {}", ckpt,
           provenance_value(hf.meta, "config"), config);
    heads = std::move(hf.heads);
    state = std::move(*hf.optimizer);
    std::fprintf(stderr, "resuming %s at step %lld of %lld\n", ckpt.c_str(),
                 static_cast<long long>(state.step), static_cast<long long>(a.steps));
  } else {
    heads = locret::RetainingHeads::random(locret::head_shapes(model->config, a.d_m), a.seed);
    state = locret::OptimizerState::zeros(heads.shapes());
  }
  std::fprintf(stderr, "heads: %u layers, d_m %lld, %llu parameters; %lld training, %lld held-out samples\n",
               heads.n_layer(), static_cast<long long>(a.d_m),
               static_cast<unsigned long long>(heads.shapes().parameters()),
               static_cast<long long>(samples.size()), static_cast<long long>(held.size()));

  const int threads =
      a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  const cpu::Isa isa = cli::isa_flag(a.isa).value_or(cpu::best_isa());
  locret::TrainerOptions to;
  to.max_tokens = longest;
  to.max_len = a.max_len;
  to.loss = {a.alpha,
             a.smooth == "mean" ? locret::SmoothReduction::kMeanLayers : locret::SmoothReduction::kSumLayers};
  to.schedule = {a.lr, warmup, a.steps};
  to.clip = a.clip;
  to.labels = a.labels;
  locret::LocretTrainer trainer(model->config, model->weights, pool, isa, heads, state, to);

  locret::TrainLoopOptions lo;
  lo.steps = a.steps;
  lo.seed = a.seed;
  lo.eval_every = a.eval_every;
  lo.checkpoint_every = a.checkpoint_every;
  lo.checkpoint_path = ckpt;
  lo.stop = [] { return interrupted(); };
  double loss_sum = 0.0;
  int64_t hits = 0, total = 0, n_logged = 0;
  auto print_eval = [](const char* what, int64_t step, const locret::EvalStats& e) {
    std::fprintf(
        stderr,
        "%s step %lld: held-out loss %.5f reg %.5f top-10%% overlap %.4f (recency %.4f; labels: mean "
        "%.3f, std within a prompt %.3f)\n",
        what, static_cast<long long>(step), e.loss, e.reg, e.acc, e.recency_acc, e.label_mean, e.label_std);
  };
  const locret::TrainResult r =
      locret::train_loop(trainer, heads, state, samples, held, lo, meta, [&](const locret::StepReport& rep) {
        if (rep.initial) {
          print_eval("eval (before training)", rep.step, *rep.eval);
          return;
        }
        loss_sum += rep.sample.loss;
        hits += rep.sample.overlap.hits;
        total += rep.sample.overlap.total;
        ++n_logged;
        if (rep.step % a.log_every == 0 || rep.step == a.steps) {
          std::fprintf(stderr, "step %lld/%lld lr %.3g loss %.5f overlap %.4f (%.2f s/step)%s\n",
                       static_cast<long long>(rep.step), static_cast<long long>(a.steps), rep.lr,
                       loss_sum / static_cast<double>(n_logged),
                       total > 0 ? static_cast<double>(hits) / static_cast<double>(total) : 0.0, rep.seconds,
                       rep.checkpointed ? fmt::format(", checkpoint {}", ckpt).c_str() : "");
          loss_sum = 0.0;
          hits = total = n_logged = 0;
        }
        if (rep.eval) print_eval("eval", rep.step, *rep.eval);
      });
  if (r.stopped) {
    std::fprintf(stderr, "stopped at step %lld; checkpoint %s (rerun with --resume)\n",
                 static_cast<long long>(state.step), ckpt.c_str());
    fail(ErrorKind::kInterrupted, "stopped at step {}", state.step);
  }
  if (r.last_eval) {
    meta.provenance.emplace_back("held_out_overlap", fmt::format("{:.4f}", r.last_eval->acc));
    meta.provenance.emplace_back("held_out_reg_loss", fmt::format("{:.5f}", r.last_eval->reg));
  }
  locret::save_heads(a.out, heads, meta);
  std::fprintf(stderr, "wrote %s (%llu parameters, model %s)\n", a.out.c_str(),
               static_cast<unsigned long long>(heads.shapes().parameters()), hash.c_str());
  return 0;
}

}  // namespace

void add_train_locret(CLI::App& app, Runner& run) {
  auto a = std::make_shared<TrainLocretArgs>();
  CLI::App* cmd = app.add_subcommand("train-locret",
                                     "Train Locret retaining heads on a frozen model (spec locret.md: "
                                     "SmoothL1 + smoothness loss, exact gradients, "
                                     "AdamW, linear warmup/decay, value clipping); prints loss and the "
                                     "top-10% overlap, checkpoints atomically");
  cmd->add_option("-m,--model", a->model, "GGUF model file (the frozen backbone)")->required();
  cmd->add_option("-o,--out", a->out, "output head file (GGUF, tied to the model's hash)")
      ->required()
      ->check(output_file());
  cmd->add_option("--data", a->data,
                  "training data, JSONL: {\"prompt\": ..., \"answer\": ...} per line (\"system\" optional)");
  cmd->add_option("--fixture-samples", a->fixture_samples,
                  "train on N generated match-fixture samples instead (for `kvtier locret-fixture` models)")
      ->check(positive());
  cmd->add_option("--steps", a->steps,
                  "optimizer steps (one sample each); 0 writes untrained heads (seeded N(0, 0.02), no data)")
      ->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "warmup steps of the linear schedule (default: 2/3 of --steps)");
  cmd->add_option("--lr", a->lr, "peak learning rate")->capture_default_str();
  cmd->add_option("--d-m", a->d_m, "intermediate size of each head (the paper: 1024)")
      ->check(positive())
      ->capture_default_str();
  cmd->add_option("--alpha", a->alpha, "weight of the smoothness term")->capture_default_str();
  cmd->add_option("--smooth-reduction", a->smooth, "smoothness term over layers: sum (the reference) or mean")
      ->check(CLI::IsMember({"sum", "mean"}))
      ->capture_default_str();
  cmd->add_option("--labels", a->labels,
                  "regression target: raw (the reference's max logit) or centered (minus its mean over the "
                  "prompt, per layer and KV head: the ranking eviction uses, without the per-sample offset)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, locret::LabelTarget>{
          {"raw", locret::LabelTarget::kRaw}, {"centered", locret::LabelTarget::kCentered}}))
      ->default_str("raw");
  cmd->add_option("--clip", a->clip, "gradient clipping by value")->check(positive())->capture_default_str();
  cmd->add_option("--seed", a->seed, "seed of the head initialisation and of the sample order")
      ->capture_default_str();
  cmd->add_option("--max-len", a->max_len, "prompt tokens trained on (labels use the whole prompt)")
      ->check(positive())
      ->capture_default_str();
  cmd->add_option("--max-tokens", a->max_tokens,
                  "longest sample (prompt + answer) kept; longer ones are skipped")
      ->check(positive())
      ->capture_default_str();
  cmd->add_option("--held-out", a->held_out,
                  "samples (from the end of the data) kept for evaluation (default: 10%, at most 20)");
  cmd->add_option("--eval-every", a->eval_every,
                  "evaluate the held-out samples every N steps (0: start and end)")
      ->check(non_negative())
      ->capture_default_str();
  cmd->add_option("--checkpoint", a->checkpoint, "checkpoint file (default: OUT.ckpt)");
  cmd->add_option("--checkpoint-every", a->checkpoint_every, "steps between checkpoints (0: none)")
      ->check(non_negative())
      ->capture_default_str();
  cmd->add_flag("--resume", a->resume,
                "continue from the checkpoint if it exists (same configuration required)");
  cmd->add_option("--log-every", a->log_every, "steps per progress line")
      ->check(positive())
      ->capture_default_str();
  cmd->add_option("--chat-template", a->chat_template,
                  "format prompts with this template (default: the model's)");
  cmd->add_flag("--raw", a->raw, "no chat template: prompt text, then ' ' + answer");
  cmd->add_option("-t,--threads", a->threads, "worker threads (default: all cores)")->check(non_negative());
  cmd->add_option("--isa", a->isa, "CPU kernel path (default: the best the CPU has)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  cmd->callback([&run, a] { run = [a] { return run_train_locret(*a); }; });
}

void add_locret_fixture(CLI::App& app, Runner& run) {
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "locret-fixture",
      "Write the Locret match-head test model (spec locret.md §7 C1: 4 layers, GQA 4/2, match heads whose "
      "important tokens are known); train heads for it with train-locret --fixture-samples N");
  cmd->add_option("-o,--out", *out, "output GGUF file")->required();
  cmd->callback([&run, out] {
    run = [out] {
      locret::write_match_model(*out);
      std::fprintf(stderr, "wrote %s\n", out->c_str());
      return 0;
    };
  });
}

}  // namespace kvtier::cli
