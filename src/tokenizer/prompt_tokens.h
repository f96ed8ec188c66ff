// The tokens of a one-turn prompt as generation is fed it (kvtier eval, compare, locret-data and the
// diagnostics that rebuild their prompts share this one formatting).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvtier::tokenizer {

// With a template: the user turn in `tmpl` with the assistant's turn opened, then `answer_prefix`
// (special tokens parsed; BOS added unless the template writes it). Without one: the raw user text, a
// blank line and the prefix, with the tokenizer's own special tokens.
std::vector<TokenId> one_turn_prompt_tokens(const Tokenizer& tok, const std::optional<ChatTemplate>& tmpl,
                                            std::string_view user, std::string_view answer_prefix);

}  // namespace kvtier::tokenizer
