#include "tokenizer/prompt_tokens.h"

#include <string>

namespace kvtier::tokenizer {

std::vector<TokenId> one_turn_prompt_tokens(const Tokenizer& tok, const std::optional<ChatTemplate>& tmpl,
                                            std::string_view user, std::string_view answer_prefix) {
  if (!tmpl) return tok.encode(std::string(user) + "\n\n" + std::string(answer_prefix));
  const Vocab& v = tok.vocab();
  const std::string bos = v.special.bos != kNoToken ? v.text[v.special.bos] : "";
  const std::string eos = v.special.eos != kNoToken ? v.text[v.special.eos] : "";
  const std::vector<ChatMessage> msgs = {{"user", std::string(user)}};
  const std::string text = format_chat(*tmpl, msgs, true, bos, eos) + std::string(answer_prefix);
  return tok.encode(text, {.add_special = !template_writes_bos(*tmpl), .parse_special = true});
}

}  // namespace kvtier::tokenizer
