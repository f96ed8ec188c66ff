// Pieces shared by `kvtier eval` and `kvtier compare`: grid flag parsing, the prompt as the model
// sees it (chat template), and the run metadata recorded with results (commit, machine, times).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "eval/task.h"
#include "runtime/model_files.h"
#include "tokenizer/chat_template.h"

namespace kvtier::cli {

std::vector<std::string> split_commas(const std::string& s);
// "512,1k,32k" -> tokens (k = 1024); `flag` names the flag in errors.
std::vector<int64_t> parse_lengths(const std::string& s, const char* flag = "--lengths");
// "0,0.5,1" -> depths in [0, 1].
std::vector<double> parse_depths(const std::string& s);

// The tokens generate() is fed for an eval prompt: the one-turn chat in `tmpl` plus the answer
// prefix, or the raw user text and prefix without a template.
std::vector<int32_t> eval_prompt_tokens(const runtime::LoadedModel& model,
                                        const std::optional<tokenizer::ChatTemplate>& tmpl,
                                        const eval::Prompt& p);

// `git describe` of the source tree the binary was built from ("unknown" if not a checkout).
std::string source_commit();
// "AMD EPYC ..., 2 hardware threads".
std::string machine_description();
std::string now_iso();
// 75.3 -> "1m15s" (negative: "?").
std::string duration_text(double seconds);

}  // namespace kvtier::cli
