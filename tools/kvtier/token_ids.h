// Token ids given on the command line ("1,2,3", the --ids flag of run and detokenize).
#pragma once

#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvtier::cli {

// "1,2,3" -> ids, each checked against the model's vocabulary; an empty, malformed or out-of-range
// item is Error(kInvalidArgument) naming it.
std::vector<tokenizer::TokenId> parse_token_ids(const tokenizer::Tokenizer& tok, std::string_view text);

}  // namespace kvtier::cli
