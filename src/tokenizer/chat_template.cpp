#include "tokenizer/chat_template.h"

#include <fmt/format.h>

#include <array>

#include "core/error.h"

namespace kvtier::tokenizer {
namespace {

constexpr std::array kAll = {ChatTemplate::kChatml, ChatTemplate::kSmollm2, ChatTemplate::kQwen2,
                             ChatTemplate::kGemma,  ChatTemplate::kLlama3,  ChatTemplate::kLlama2,
                             ChatTemplate::kMistral};

constexpr std::string_view kSmollmSystem =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
constexpr std::string_view kQwenSystem = "You are a helpful assistant.";

bool contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

// Jinja's `trim` (Python str.strip() on ASCII whitespace, which is what chat text carries).
std::string trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

std::string chatml(std::span<const ChatMessage> msgs, bool gen, std::string_view default_system) {
  std::string out;
  if (!default_system.empty() && (msgs.empty() || msgs[0].role != "system")) {
    out += "<|im_start|>system\n";
    out += default_system;
    out += "<|im_end|>\n";
  }
  for (const auto& m : msgs) out += fmt::format("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string gemma(std::span<const ChatMessage> msgs, bool gen, std::string_view bos) {
  std::string out(bos);
  std::string prefix;
  size_t start = 0;
  if (!msgs.empty() && msgs[0].role == "system") {
    prefix = msgs[0].content + "\n\n";
    start = 1;
  }
  for (size_t i = start; i < msgs.size(); ++i) {
    const std::string role = msgs[i].role == "assistant" ? "model" : msgs[i].role;
    out += fmt::format("<start_of_turn>{}\n{}{}<end_of_turn>\n", role, i == start ? prefix : std::string(),
                       trim(msgs[i].content));
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

std::string llama3(std::span<const ChatMessage> msgs, bool gen, std::string_view bos) {
  std::string out(bos);
  for (const auto& m : msgs) {
    out += fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>", m.role, trim(m.content));
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

void check_alternation(std::span<const ChatMessage> msgs, size_t start, std::string_view name) {
  for (size_t i = start; i < msgs.size(); ++i) {
    const bool user = msgs[i].role == "user";
    if (user != ((i - start) % 2 == 0) || (!user && msgs[i].role != "assistant"))
      fail(ErrorKind::kInvalidArgument,
           "the {} chat template needs user and assistant turns alternating (user first); message {} is '{}'",
           name, i, msgs[i].role);
  }
}

std::string llama2(std::span<const ChatMessage> msgs, std::string_view bos, std::string_view eos) {
  size_t start = 0;
  std::string system;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    start = 1;
  }
  check_alternation(msgs, start, "llama2");
  std::string out;
  for (size_t i = start; i < msgs.size(); ++i) {
    std::string content = msgs[i].content;
    if (i == start && start == 1) content = fmt::format("<<SYS>>\n{}\n<</SYS>>\n\n{}", system, content);
    if (msgs[i].role == "user") {
      out += fmt::format("{}[INST] {} [/INST]", bos, trim(content));
    } else {
      out += fmt::format(" {} {}", trim(content), eos);
    }
  }
  return out;
}

std::string mistral(std::span<const ChatMessage> msgs, std::string_view bos, std::string_view eos) {
  size_t start = 0;
  std::string system;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    start = 1;
  }
  check_alternation(msgs, start, "mistral");
  std::string out(bos);
  for (size_t i = start; i < msgs.size(); ++i) {
    if (msgs[i].role == "user") {
      const std::string content =
          (i == start && start == 1) ? fmt::format("{}\n\n{}", system, msgs[i].content) : msgs[i].content;
      out += fmt::format("[INST] {} [/INST]", content);
    } else {
      out += fmt::format("{}{}", msgs[i].content, eos);
    }
  }
  return out;
}

}  // namespace

std::string_view chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kChatml:
      return "chatml";
    case ChatTemplate::kSmollm2:
      return "smollm2";
    case ChatTemplate::kQwen2:
      return "qwen2";
    case ChatTemplate::kGemma:
      return "gemma";
    case ChatTemplate::kLlama3:
      return "llama3";
    case ChatTemplate::kLlama2:
      return "llama2";
    case ChatTemplate::kMistral:
      return "mistral";
  }
  return "?";
}

std::string chat_template_names() {
  std::string s;
  for (ChatTemplate t : kAll) s += (s.empty() ? "" : ", ") + std::string(chat_template_name(t));
  return s;
}

ChatTemplate parse_chat_template(std::string_view name) {
  for (ChatTemplate t : kAll) {
    if (chat_template_name(t) == name) return t;
  }
  fail(ErrorKind::kInvalidArgument, "unknown chat template '{}' (known: {})", name, chat_template_names());
}

std::optional<ChatTemplate> detect_chat_template(std::string_view j) {
  if (contains(j, "<|im_start|>")) {
    if (contains(j, kSmollmSystem)) return ChatTemplate::kSmollm2;
    if (contains(j, kQwenSystem)) return ChatTemplate::kQwen2;
    if (contains(j, "<|im_start|>system")) return std::nullopt;  // a default system prompt we do not know
    return ChatTemplate::kChatml;
  }
  if (contains(j, "<start_of_turn>")) return ChatTemplate::kGemma;
  if (contains(j, "<|start_header_id|>") && contains(j, "<|end_header_id|>")) return ChatTemplate::kLlama3;
  if (contains(j, "[INST]")) return contains(j, "<<SYS>>") ? ChatTemplate::kLlama2 : ChatTemplate::kMistral;
  return std::nullopt;
}

ChatTemplate chat_template_for(const Vocab& v, std::optional<std::string_view> override) {
  if (override) return parse_chat_template(*override);
  if (!v.chat_template) {
    if (v.architecture.starts_with("gemma")) return ChatTemplate::kGemma;
    fail(ErrorKind::kInvalidArgument,
         "the model has no chat template (tokenizer.chat_template); pick one with "
         "--chat-template NAME ({})",
         chat_template_names());
  }
  const auto t = detect_chat_template(*v.chat_template);
  if (!t)
    fail(ErrorKind::kUnsupported,
         "the model's chat template is not one kvtier recognises; pick a formatter with --chat-template NAME "
         "({})",
         chat_template_names());
  return *t;
}

bool template_writes_bos(ChatTemplate t) {
  return t == ChatTemplate::kGemma || t == ChatTemplate::kLlama3 || t == ChatTemplate::kLlama2 ||
         t == ChatTemplate::kMistral;
}

std::string format_chat(ChatTemplate t, std::span<const ChatMessage> msgs, bool gen, std::string_view bos,
                        std::string_view eos) {
  switch (t) {
    case ChatTemplate::kChatml:
      return chatml(msgs, gen, "");
    case ChatTemplate::kSmollm2:
      return chatml(msgs, gen, kSmollmSystem);
    case ChatTemplate::kQwen2:
      return chatml(msgs, gen, kQwenSystem);
    case ChatTemplate::kGemma:
      return gemma(msgs, gen, bos);
    case ChatTemplate::kLlama3:
      return llama3(msgs, gen, bos);
    case ChatTemplate::kLlama2:
      return llama2(msgs, bos, eos);
    case ChatTemplate::kMistral:
      return mistral(msgs, bos, eos);
  }
  return {};
}

}  // namespace kvtier::tokenizer
