#include "eval/task.h"

#include <array>

#include "core/error.h"

namespace kvtier::eval {
namespace {

constexpr std::array kTasks = {TaskKind::kPpl,
                               TaskKind::kPasskey,
                               TaskKind::kNiah,
                               TaskKind::kNiahMultiKey,
                               TaskKind::kNiahMultiValue,
                               TaskKind::kNiahMultiQuery,
                               TaskKind::kVt,
                               TaskKind::kCwe};

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

}  // namespace

std::string_view task_name(TaskKind t) {
  switch (t) {
    case TaskKind::kPpl:
      return "ppl";
    case TaskKind::kPasskey:
      return "passkey";
    case TaskKind::kNiah:
      return "niah";
    case TaskKind::kNiahMultiKey:
      return "niah-mk";
    case TaskKind::kNiahMultiValue:
      return "niah-mv";
    case TaskKind::kNiahMultiQuery:
      return "niah-mq";
    case TaskKind::kVt:
      return "vt";
    case TaskKind::kCwe:
      return "cwe";
  }
  return "?";
}

std::string task_names() {
  std::string s;
  for (TaskKind t : kTasks) {
    if (!s.empty()) s += ", ";
    s += task_name(t);
  }
  return s;
}

TaskKind parse_task(std::string_view name) {
  for (TaskKind t : kTasks) {
    if (task_name(t) == name) return t;
  }
  fail(ErrorKind::kInvalidArgument, "unknown task '{}' (tasks: {}; lists: all, niah-all)", name,
       task_names());
}

std::vector<TaskKind> parse_task_list(std::string_view list) {
  std::vector<TaskKind> out;
  const auto add = [&](TaskKind t) {
    for (TaskKind u : out) {
      if (u == t) return;
    }
    out.push_back(t);
  };
  while (true) {
    const size_t comma = list.find(',');
    const std::string_view item = trim(list.substr(0, comma));
    if (item == "all") {
      for (TaskKind t : kTasks) add(t);
    } else if (item == "niah-all") {
      for (TaskKind t :
           {TaskKind::kNiah, TaskKind::kNiahMultiKey, TaskKind::kNiahMultiValue, TaskKind::kNiahMultiQuery})
        add(t);
    } else {
      add(parse_task(item));
    }
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

bool task_has_depth(TaskKind t) {
  switch (t) {
    case TaskKind::kPasskey:
    case TaskKind::kNiah:
    case TaskKind::kNiahMultiKey:
    case TaskKind::kNiahMultiValue:
    case TaskKind::kNiahMultiQuery:
      return true;
    case TaskKind::kPpl:
    case TaskKind::kVt:
    case TaskKind::kCwe:
      return false;
  }
  return false;
}

int task_max_new_tokens(TaskKind t) {
  switch (t) {
    case TaskKind::kPpl:
      return 0;
    case TaskKind::kPasskey:
      return 12;
    case TaskKind::kNiah:
    case TaskKind::kNiahMultiKey:
      return 24;
    case TaskKind::kNiahMultiValue:
    case TaskKind::kNiahMultiQuery:
      return 64;
    case TaskKind::kVt:
      return 40;
    case TaskKind::kCwe:
      return 80;
  }
  return 0;
}

std::string_view task_scoring(TaskKind t) {
  switch (t) {
    case TaskKind::kPpl:
      return "perplexity exp(mean NLL) of the second half of each window (lower is better)";
    case TaskKind::kPasskey:
      return "1 if the 5-digit pass key appears in the answer as a whole word, else 0";
    case TaskKind::kNiah:
    case TaskKind::kNiahMultiKey:
      return "1 if the 7-digit number of the asked key appears in the answer as a whole word, else 0";
    case TaskKind::kNiahMultiValue:
    case TaskKind::kNiahMultiQuery:
      return "fraction of the 4 expected 7-digit numbers that appear in the answer as whole words";
    case TaskKind::kVt:
      return "fraction of the 5 chained variable names that appear in the answer as whole words";
    case TaskKind::kCwe:
      return "fraction of the 10 common words that appear in the answer as whole words (any case)";
  }
  return "";
}

}  // namespace kvtier::eval
