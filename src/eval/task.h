// Evaluation tasks and their samples. A sample is a prompt (user message plus the text that opens
// the assistant's answer), the strings the answer must contain, and where the needle sits.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::eval {

enum class TaskKind : uint8_t {
  kPpl,             // perplexity of a long text in windows of each length
  kPasskey,         // a 5-digit pass key in the passkey filler
  kNiah,            // RULER niah_single: one key -> 7-digit number needle in essay text
  kNiahMultiKey,    // RULER niah_multikey: 4 needles with different keys, one asked for
  kNiahMultiValue,  // RULER niah_multivalue: one key with 4 values, all asked for
  kNiahMultiQuery,  // RULER niah_multiquery: 4 keys, all asked for
  kVt,              // RULER variable tracking: one chain of 4 hops (5 variables)
  kCwe,             // RULER common words extraction: the 10 words seen 30 times among words seen 3 times
};

std::string_view task_name(TaskKind t);
// All names, comma-separated (for messages and --help).
std::string task_names();
// Parses a task name; "niah-all" is not a name (see parse_task_list). Throws Error listing names.
TaskKind parse_task(std::string_view name);
// A comma-separated list; "all" stands for every task, "niah-all" for the four niah variants.
std::vector<TaskKind> parse_task_list(std::string_view list);
// Whether the task has a needle-depth axis (passkey and the niah variants).
bool task_has_depth(TaskKind t);
// Tokens generated at most for one answer.
int task_max_new_tokens(TaskKind t);
// One line on how the task scores an answer (for reports).
std::string_view task_scoring(TaskKind t);

// The text sent to the model: a one-turn conversation in the model's chat template, or raw text
// for a model without one. `answer_prefix` is appended after the assistant turn opens.
struct Prompt {
  std::string user;
  std::string answer_prefix;
};

struct Sample {
  TaskKind task = TaskKind::kNiah;
  int64_t length = 0;    // target context: prompt tokens + max new tokens <= length
  int depth_index = -1;  // index into the depth grid; -1: the task has no depth axis
  double depth = -1.0;   // needle depth in [0, 1] (fraction of the haystack before it); -1: none
  int index = 0;         // sample number within its cell
  uint64_t seed = 0;     // the seed this sample was drawn from
  Prompt prompt;
  std::vector<std::string> expected;  // strings the answer must contain (score = fraction found)
  int64_t prompt_tokens = 0;          // tokens of the formatted prompt
  int max_new_tokens = 0;
};

// Counts the tokens of a formatted prompt (the model's tokenizer and chat template; tests use a
// stand-in).
using TokenCounter = std::function<int64_t(const Prompt&)>;

struct GridSpec {
  std::vector<int64_t> lengths;  // target contexts (tokens)
  std::vector<double> depths;    // needle depths in [0, 1] (tasks with a depth axis)
  int samples = 1;               // per cell
  uint64_t seed = 0;
};

// Builds one sample: the largest haystack whose formatted prompt fits `length - max_new_tokens`
// tokens. Throws Error if even an empty haystack does not fit.
Sample make_sample(TaskKind t, int64_t length, int depth_index, double depth, int index, uint64_t seed,
                   const TokenCounter& count);
// Every sample of a task over the grid (lengths x depths x samples, in that order).
std::vector<Sample> make_samples(TaskKind t, const GridSpec& grid, const TokenCounter& count);

}  // namespace kvtier::eval
