// Unit tests of the tokenizer module on small vocabularies written as GGUF files here (the real
// models are checked against the reference tokenizers by test_tokenizer_reference.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/temp_file.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "gguf/writer.h"
#include "model/synthetic.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvtier::tokenizer {
namespace {

using gguf::Value;

Tokenizer load(const gguf::Writer& w, const std::string& name) {
  const ::kvtier::test::TempFile path("kvtier_tok", "_" + name);  // removed also when the tokenizer throws
  w.write(path.str());
  const gguf::File f(path.str());
  return Tokenizer(f);
}

// The vocabulary `kvtier synth` writes: 256 byte tokens, two controls, no merges, pre "gpt-2".
gguf::Writer synth_tokenizer(const std::string& pre = "gpt-2") {
  gguf::Writer w;
  const uint32_t n = 300;
  std::vector<int32_t> types(n, 5);
  for (int i = 0; i < 256; ++i) types[i] = 1;
  types[256] = types[257] = 3;
  w.set("general.architecture", Value::string("llama"));
  w.set("tokenizer.ggml.model", Value::string("gpt2"));
  w.set("tokenizer.ggml.pre", Value::string(pre));
  w.set("tokenizer.ggml.tokens", Value::string_array(model::synth_vocab(n)));
  w.set("tokenizer.ggml.token_type", Value::i32_array(types));
  w.set("tokenizer.ggml.merges", Value::string_array({}));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(256));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(257));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  return w;
}

TEST(ByteLevel, SyntheticVocabularyIsOneTokenPerByte) {
  const Tokenizer tok = load(synth_tokenizer(), "synth.gguf");
  const std::string text = "Hi, w\xC3\xB6rld \xF0\x9F\x98\x80 12";
  const auto ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size() + 1);
  EXPECT_EQ(ids[0], 256);  // BOS: add_bos_token
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i + 1], static_cast<unsigned char>(text[i]));
  EXPECT_EQ(tok.decode(std::vector<TokenId>(ids.begin() + 1, ids.end())), text);
  EXPECT_EQ(tok.encode(text, {.add_special = false}).size(), text.size());
}

TEST(ByteLevel, ControlTokensOnlyWhenAsked) {
  const Tokenizer tok = load(synth_tokenizer(), "synth2.gguf");
  const std::string text = "<|end_of_text|>";
  EXPECT_EQ(tok.encode(text, {.add_special = false, .parse_special = false}).size(), text.size());
  EXPECT_EQ(tok.encode(text, {.add_special = false, .parse_special = true}), std::vector<TokenId>{257});
  EXPECT_TRUE(tok.is_end_of_generation(257));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{257}, {.render_special = false}), "");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{257}), text);
}

TEST(ByteLevel, UnknownPreTokenizerIsAnErrorNamingIt) {
  try {
    load(synth_tokenizer("no-such-pre"), "synth3.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-pre"), std::string::npos) << e.what();
  }
}

TEST(ByteLevel, EveryPreTokenizerCompilesAndCoversTheText) {
  for (PreTokenizer p :
       {PreTokenizer::kGpt2, PreTokenizer::kSmollm, PreTokenizer::kLlama3, PreTokenizer::kQwen2}) {
    const PreTokenizerRegex re(p);
    const std::string text = "I'm 12345 ab\xFF\xFE  \n\n x \xE4\xBD\xA0\xE5\xA5\xBD!!";
    std::vector<Span> pieces;
    re.split(text, pieces);
    size_t pos = 0;
    for (const Span& s : pieces) {
      EXPECT_EQ(s.begin, pos);
      EXPECT_LT(s.begin, s.end);
      pos = s.end;
    }
    EXPECT_EQ(pos, text.size()) << pre_tokenizer_name(p);
  }
}

// A tiny SentencePiece vocabulary: merges by score, byte fallback, add_space_prefix.
gguf::Writer spm_tokenizer(bool space_prefix) {
  std::vector<std::string> toks = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    toks.push_back(fmt::format("<0x{:02X}>", b));
    types.push_back(6);
  }
  const std::vector<std::pair<std::string, float>> pieces = {
      {"\xE2\x96\x81", -1}, {"h", -2},  {"e", -3},  {"l", -4},    {"o", -5},      {"\xE2\x96\x81h", -6},
      {"ll", -7},           {"he", -8}, {"lo", -9}, {"llo", -10}, {"hello", -11}, {"\xE2\x96\x81hello", -12}};
  std::vector<float> scores(toks.size(), 0.0f);
  for (const auto& [t, s] : pieces) {
    toks.push_back(t);
    types.push_back(1);
    scores.push_back(s);
  }
  gguf::Writer w;
  w.set("general.architecture", Value::string("llama"));
  w.set("tokenizer.ggml.model", Value::string("llama"));
  w.set("tokenizer.ggml.tokens", Value::string_array(toks));
  w.set("tokenizer.ggml.token_type", Value::i32_array(types));
  w.set("tokenizer.ggml.scores", Value::f32_array(scores));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(2));
  w.set("tokenizer.ggml.unknown_token_id", Value::u32(0));
  w.set("tokenizer.ggml.add_space_prefix", Value::boolean(space_prefix));
  return w;
}

TEST(SentencePiece, MergesByScoreWithByteFallback) {
  const Tokenizer tok = load(spm_tokenizer(true), "spm.gguf");
  const auto& v = tok.vocab();
  auto id = [&](std::string_view s) { return v.find(s); };
  // "hello" -> "▁hello": ▁h (-6) merges before ll (-7), he never forms; "▁h"+"e" is no token, so
  // ll, then llo, ... and "▁hello" is reachable only via "▁h"+"ello" (no) -> ▁h, e, llo.
  const auto ids = tok.encode("hello", {.add_special = false});
  EXPECT_EQ(ids, (std::vector<TokenId>{id("\xE2\x96\x81h"), id("e"), id("llo")}));
  // "é" is not in the vocabulary: its two bytes.
  const auto ids2 = tok.encode("\xC3\xA9", {.add_special = false});
  EXPECT_EQ(ids2, (std::vector<TokenId>{id("\xE2\x96\x81"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.encode("o").front(), 1);  // BOS by default for SentencePiece
  // Decoding drops the prefixed space and joins byte tokens.
  EXPECT_EQ(tok.decode(tok.encode("hello h\xC3\xA9", {.add_special = false})), "hello h\xC3\xA9");
}

TEST(SentencePiece, NoSpacePrefixWhenTheFileSaysSo) {
  const Tokenizer tok = load(spm_tokenizer(false), "spm2.gguf");
  const auto ids = tok.encode("hello", {.add_special = false});
  // ll (-7), he (-8), llo (-10), then he + llo = hello (-11).
  EXPECT_EQ(ids, (std::vector<TokenId>{tok.vocab().find("hello")}));
}

TEST(StreamDecoder, HoldsBackIncompleteCharacters) {
  const Tokenizer tok = load(synth_tokenizer(), "synth4.gguf");
  StreamDecoder d(tok);
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.push(0xBD), "");
  EXPECT_EQ(d.push(0xA0), "\xE4\xBD\xA0");
  EXPECT_EQ(d.push('a'), "a");
  EXPECT_EQ(d.push(0xFF), "\xEF\xBF\xBD");  // never valid: released at once as U+FFFD
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push('b'),
            "\xEF\xBF\xBD"
            "b");  // the held lead byte turned out invalid
  EXPECT_EQ(d.push(0xC3), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");  // stream ended inside a character
}

TEST(Utf8, SanitizeAndTails) {
  EXPECT_EQ(utf8_sanitize("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(utf8_sanitize("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(utf8_sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8_sanitize("\xE4\xBD"), "\xEF\xBF\xBD");                              // truncated: one U+FFFD
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xC3"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("a\xFF"), 0u);
}

TEST(ChatTemplate, DetectsFamilies) {
  EXPECT_EQ(detect_chat_template("{{'<|im_start|>' + message['role']}}"), ChatTemplate::kChatml);
  EXPECT_EQ(
      detect_chat_template("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                           "Hugging Face<|im_end|>"),
      ChatTemplate::kSmollm2);
  EXPECT_EQ(detect_chat_template("'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n'"),
            ChatTemplate::kQwen2);
  EXPECT_EQ(detect_chat_template("{{ '<start_of_turn>' + role }}"), ChatTemplate::kGemma);
  EXPECT_EQ(detect_chat_template("<|start_header_id|>' + message['role'] + '<|end_header_id|>"),
            ChatTemplate::kLlama3);
  EXPECT_EQ(detect_chat_template("[INST] <<SYS>>\\n"), ChatTemplate::kLlama2);
  EXPECT_EQ(detect_chat_template("{{ '[INST] ' + message['content'] + ' [/INST]' }}"),
            ChatTemplate::kMistral);
  EXPECT_EQ(detect_chat_template("{{ messages }}"), std::nullopt);
}

TEST(ChatTemplate, UnknownNameListsTheNames) {
  try {
    parse_chat_template("vicuna");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chatml, smollm2, qwen2, gemma, llama3, llama2, mistral"),
              std::string::npos);
  }
}

TEST(ChatTemplate, Formats) {
  const std::vector<ChatMessage> m = {
      {"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(
      format_chat(ChatTemplate::kGemma, m, true, "<bos>", "<eos>"),
      "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
      "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(format_chat(ChatTemplate::kQwen2, std::span(m).subspan(1, 1), true, "", ""),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(format_chat(ChatTemplate::kLlama3, std::span(m).subspan(0, 2), false, "<|begin_of_text|>", ""),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  EXPECT_EQ(format_chat(ChatTemplate::kLlama2, m, false, "<s>", "</s>"),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello. </s><s>[INST] Bye [/INST]");
  EXPECT_EQ(format_chat(ChatTemplate::kMistral, std::span(m).subspan(1), false, "<s>", "</s>"),
            "<s>[INST]  Hi  [/INST]Hello.</s>[INST] Bye [/INST]");
  EXPECT_THROW(format_chat(ChatTemplate::kMistral, std::span(m).subspan(2), false, "<s>", "</s>"), Error);
}

}  // namespace
}  // namespace kvtier::tokenizer
