#include "eval/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "eval/ppl.h"
#include "eval/rng.h"
#include "eval/score.h"
#include "eval/text.h"

namespace kvtier::eval {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One unit of work: a sample of a task, or a ppl window, under one policy. Its cost is estimated
// from its tokens for the ETA.
struct Job {
  TaskKind task;
  const Sample* sample = nullptr;
  const PplWindow* window = nullptr;
  std::string policy;
  double cost = 0.0;
};

std::string label(const Job& j) {
  if (j.window) return fmt::format("ppl {} window {} {}", j.window->length, j.window->index, j.policy);
  const Sample& s = *j.sample;
  if (s.depth_index >= 0)
    return fmt::format("{} {} d={:.2f} #{} {}", task_name(s.task), s.length, s.depth, s.index, j.policy);
  return fmt::format("{} {} #{} {}", task_name(s.task), s.length, s.index, j.policy);
}

}  // namespace

std::string_view ppl_default_source() {
  return "generated essay filler (kvtier's seeded English grammar, src/eval/text.cpp)";
}

std::string ppl_default_text(Engine& e, uint64_t seed, int64_t min_tokens) {
  const FillerStream essay(Filler::kEssay, mix_seed(seed, {0x7070ull}));
  int64_t n = std::max<int64_t>(16, min_tokens / 12);
  while (true) {
    std::string text = essay.text(n);
    const auto tokens = static_cast<int64_t>(e.tokenize(text).size());
    if (tokens >= min_tokens) return text;
    n = n * 3 / 2 + 16;
  }
}

Results run_eval(Engine& e, const EvalPlan& plan, const ProgressSink& progress) {
  if (plan.policies.empty()) fail(ErrorKind::kInvalidArgument, "no KV policy to evaluate");
  if (plan.grid.lengths.empty()) fail(ErrorKind::kInvalidArgument, "no context length to evaluate");
  if (plan.grid.samples < 1) fail(ErrorKind::kInvalidArgument, "--samples must be at least 1");

  // Prompts first (every policy sees the same ones), then the work list.
  std::vector<std::vector<Sample>> samples(plan.tasks.size());
  std::vector<int32_t> ppl_tokens;
  std::vector<PplWindow> windows;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const TaskKind task = plan.tasks[t];
    if (task == TaskKind::kPpl) {
      const int64_t max_len = *std::max_element(plan.grid.lengths.begin(), plan.grid.lengths.end());
      const int64_t need = max_len / 2 * (plan.grid.samples + 1) + 1;
      const std::string text =
          plan.ppl_text.empty() ? ppl_default_text(e, plan.grid.seed, need) : plan.ppl_text;
      ppl_tokens = e.tokenize(text);
      for (int64_t len : plan.grid.lengths) {
        const auto w = plan_windows(static_cast<int64_t>(ppl_tokens.size()), len, plan.grid.samples);
        if (w.empty())
          fail(ErrorKind::kInvalidArgument, "ppl: the text has {} tokens, fewer than the length {}",
               ppl_tokens.size(), len);
        windows.insert(windows.end(), w.begin(), w.end());
      }
    } else {
      samples[t] = make_samples(task, plan.grid, [&](const Prompt& p) { return e.count_tokens(p); });
    }
  }
  std::vector<Job> jobs;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    for (const std::string& policy : plan.policies) {
      if (plan.tasks[t] == TaskKind::kPpl) {
        for (const PplWindow& w : windows)
          jobs.push_back({TaskKind::kPpl, nullptr, &w, policy, static_cast<double>(w.length)});
      } else {
        for (const Sample& s : samples[t])
          jobs.push_back(
              {s.task, &s, nullptr, policy, static_cast<double>(s.prompt_tokens + s.max_new_tokens)});
      }
    }
  }

  double total_cost = 0.0;
  for (const Job& j : jobs) total_cost += j.cost;
  Results results;
  const auto t0 = Clock::now();
  double done_cost = 0.0;
  std::string current_policy;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    if (j.policy != current_policy) {
      e.use_policy(j.policy);
      current_policy = j.policy;
    }
    if (progress) {
      const double el = since(t0);
      progress({static_cast<int64_t>(i), static_cast<int64_t>(jobs.size()), el,
                done_cost > 0 ? el / done_cost * (total_cost - done_cost) : -1.0, label(j)});
    }
    const auto ts = Clock::now();
    SampleResult r;
    r.policy = j.policy;
    r.task = j.task;
    if (j.window) {
      const PplWindow& w = *j.window;
      const std::span<const int32_t> toks(ppl_tokens.data() + w.begin, static_cast<size_t>(w.length));
      NllAccumulator acc(w, toks);
      e.evaluate(toks, [&](int64_t pos, std::span<const float> logits) { acc.add(pos, logits); });
      r.length = w.length;
      r.index = w.index;
      r.prompt_tokens = w.length;
      r.nll_sum = acc.nll_sum();
      r.n_scored = acc.count();
      r.score = acc.count() > 0 ? std::exp(acc.nll_sum() / static_cast<double>(acc.count())) : 0.0;
    } else {
      const Sample& s = *j.sample;
      r.length = s.length;
      r.depth_index = s.depth_index;
      r.depth = s.depth;
      r.index = s.index;
      r.seed = s.seed;
      r.prompt_tokens = s.prompt_tokens;
      r.expected = s.expected;
      r.answer = e.generate(s.prompt, s.max_new_tokens);
      r.score = score_answer(r.answer, s.expected);
    }
    r.seconds = since(ts);
    done_cost += j.cost;
    results.add(std::move(r));
  }
  if (progress) {
    progress({static_cast<int64_t>(jobs.size()), static_cast<int64_t>(jobs.size()), since(t0), 0.0, "done"});
  }
  return results;
}

}  // namespace kvtier::eval
