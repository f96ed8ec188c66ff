// Training data for the retaining heads from a JSONL file, one sample a line:
//
//   {"prompt": "<long context and question>", "answer": "<reference answer>"}   ("system" optional)
//
// The prompt is formatted with the model's chat template (a user turn, the assistant's turn opened);
// the answer follows as plain text (teacher-forced: its tokens are the label queries). Without a
// template the prompt is the raw text and the answer follows after one space (the reference's
// convention). Samples longer than max_tokens are skipped and counted.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "locret/trainer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvtier::locret {

struct JsonlStats {
  int64_t lines = 0;
  int64_t kept = 0;
  int64_t too_long = 0;  // prompt + answer over max_tokens: skipped
};

// Throws Error(kIo) when the file cannot be read and Error(kInvalidFile) naming the line of a
// malformed entry (not JSON, a missing or non-string "prompt"/"answer", an empty answer).
std::vector<Sample> read_jsonl_samples(const std::string& path, const tokenizer::Tokenizer& tok,
                                       std::optional<tokenizer::ChatTemplate> tmpl, int64_t max_tokens,
                                       JsonlStats* stats = nullptr);

}  // namespace kvtier::locret
