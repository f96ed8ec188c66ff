// Chat templates: the GGUF carries the model's Jinja template (tokenizer.chat_template); kvtier
// recognises the template of each supported family and formats conversations with a built-in
// formatter that reproduces it. No Jinja interpreter.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace kvtier::tokenizer {

enum class ChatTemplate : uint8_t {
  kChatml,   // <|im_start|>role\n...<|im_end|>\n, no default system prompt
  kSmollm2,  // ChatML, default system "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
  kQwen2,    // ChatML, default system "You are a helpful assistant."
  kGemma,    // <start_of_turn>user\n...<end_of_turn>\n; system folded into the first user turn
  kLlama3,   // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  kLlama2,   // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s>
  kMistral,  // <s>[INST] ... [/INST]...</s>
};

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

std::string_view chat_template_name(ChatTemplate t);
// All names, comma-separated (for messages).
std::string chat_template_names();
// Parses a --chat-template NAME; throws Error(kInvalidArgument) listing the names.
ChatTemplate parse_chat_template(std::string_view name);
// Recognises a Jinja template; nullopt if it is none of the supported families.
std::optional<ChatTemplate> detect_chat_template(std::string_view jinja);
// The template to use for a model: `override` if given, else the file's template recognised (a
// Gemma file without a template gets Gemma's). Throws Error naming the choices when there is none.
ChatTemplate chat_template_for(const Vocab& vocab, std::optional<std::string_view> override = std::nullopt);

// The prompt text of a conversation, with the special tokens the template writes (BOS included
// where the template writes it): tokenise it with parse_special and, if template_writes_bos, no
// add_special. `add_generation_prompt` opens the assistant's turn.
std::string format_chat(ChatTemplate t, std::span<const ChatMessage> messages, bool add_generation_prompt,
                        std::string_view bos_text, std::string_view eos_text);
bool template_writes_bos(ChatTemplate t);

}  // namespace kvtier::tokenizer
