#include "tokenizer/vocab.h"

#include <fmt/format.h>

#include "core/error.h"
#include "gguf/reader.h"
#include "tokenizer/utf8.h"

namespace kvtier::tokenizer {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// The inverse of byte_to_unicode over the code points it uses (0..0x143): byte or -1.
std::array<int16_t, 0x144> make_unicode_to_byte() {
  std::array<int16_t, 0x144> t{};
  t.fill(-1);
  for (int b = 0; b < 256; ++b) t[byte_to_unicode(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
  return t;
}

// A token spelt in the byte alphabet, as raw bytes; nullopt if any character is outside it.
std::optional<std::string> from_byte_alphabet(std::string_view s) {
  static const std::array<int16_t, 0x144> kInverse = make_unicode_to_byte();
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_valid_len(s, i);
    if (n == 0) return std::nullopt;
    const uint32_t cp = utf8_decode(s, i, n);
    if (cp >= kInverse.size() || kInverse[cp] < 0) return std::nullopt;
    out += static_cast<char>(kInverse[cp]);
    i += n;
  }
  return out;
}

// Python's str.isspace() over code points (what transformers' `not token.strip()` tests).
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Gemma files store tokens of several spaces as real spaces where the model spells them with
// U+2581; transformers respells every all-whitespace token containing a space (one U+2581 per
// character) so that the merges built from the vocabulary find them. So do we.
std::optional<std::string> gemma_respelling(std::string_view s) {
  if (s.find(' ') == std::string_view::npos) return std::nullopt;
  size_t chars = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_valid_len(s, i);
    if (n == 0 || !is_python_space(utf8_decode(s, i, n))) return std::nullopt;
    i += n;
    ++chars;
  }
  std::string out;
  for (size_t k = 0; k < chars; ++k) out += kSpace;
  return out;
}

TokenizerKind parse_kind(const std::string& model) {
  if (model == "gpt2") return TokenizerKind::kByteLevelBpe;
  if (model == "llama") return TokenizerKind::kSentencePiece;
  fail(ErrorKind::kUnsupported, "tokenizer.ggml.model '{}' is not supported (supported: gpt2, llama)", model);
}

PreTokenizer parse_pre(const std::string& pre) {
  if (pre == "gpt-2" || pre == "default" || pre == "gpt2") return PreTokenizer::kGpt2;
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell")
    return PreTokenizer::kSmollm;
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "dbrx" || pre == "smaug-bpe")
    return PreTokenizer::kLlama3;
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return PreTokenizer::kQwen2;
  fail(ErrorKind::kUnsupported,
       "tokenizer.ggml.pre '{}' is not supported (supported: gpt-2, default, smollm, starcoder, refact, "
       "codeshell, "
       "llama-bpe, llama3, llama-v3, dbrx, smaug-bpe, qwen2, deepseek-r1-qwen)",
       pre);
}

const gguf::Array& require_array(const gguf::File& f, std::string_view key, gguf::ValueType elem) {
  const gguf::Value* v = f.find(key);
  if (!v) fail(ErrorKind::kInvalidFile, "{}: tokenizer key '{}' is missing", f.path(), key);
  const gguf::Array* a = v->as_array();
  if (!a || a->elem_type != elem)
    fail(ErrorKind::kInvalidFile, "{}: tokenizer key '{}' is not an array of {}", f.path(), key,
         gguf::value_type_name(elem));
  return *a;
}

TokenId opt_id(const gguf::File& f, std::string_view key, size_t n_vocab) {
  const auto v = f.opt_int(key);
  if (!v) return kNoToken;
  if (*v < 0 || static_cast<uint64_t>(*v) >= n_vocab)
    fail(ErrorKind::kInvalidFile, "{}: {} = {} is outside the vocabulary of {} tokens", f.path(), key, *v,
         n_vocab);
  return static_cast<TokenId>(*v);
}

bool is_gemma(std::string_view arch) {
  return arch == "gemma" || arch == "gemma2" || arch == "gemma3";
}

}  // namespace

uint32_t byte_to_unicode(uint8_t b) {
  // Printable bytes stand for themselves; the others map, in order, to U+0100 onwards.
  if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
  uint32_t n = 0;  // rank of b among the non-printable bytes
  for (uint32_t c = 0; c < b; ++c) {
    if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++n;
  }
  return 256 + n;
}

std::string_view tokenizer_kind_name(TokenizerKind k) {
  switch (k) {
    case TokenizerKind::kByteLevelBpe:
      return "gpt2";
    case TokenizerKind::kSentencePiece:
      return "llama";
  }
  return "?";
}

std::string_view pre_tokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::kGpt2:
      return "gpt-2";
    case PreTokenizer::kSmollm:
      return "smollm";
    case PreTokenizer::kLlama3:
      return "llama-bpe";
    case PreTokenizer::kQwen2:
      return "qwen2";
  }
  return "?";
}

Vocab load_vocab(const gguf::File& f) {
  Vocab v;
  const auto model = f.opt_string("tokenizer.ggml.model");
  if (!model) fail(ErrorKind::kInvalidFile, "{}: no tokenizer (tokenizer.ggml.model is missing)", f.path());
  v.kind = parse_kind(*model);
  v.architecture = f.opt_string("general.architecture").value_or("");
  if (v.kind == TokenizerKind::kByteLevelBpe)
    v.pre = parse_pre(f.opt_string("tokenizer.ggml.pre").value_or("default"));
  v.merge_order = is_gemma(v.architecture) ? MergeOrder::kVocabOrder : MergeOrder::kScore;

  const gguf::Array& tokens = require_array(f, "tokenizer.ggml.tokens", gguf::ValueType::kString);
  const size_t n = tokens.size();
  if (n == 0) fail(ErrorKind::kInvalidFile, "{}: tokenizer.ggml.tokens is empty", f.path());
  if (n > static_cast<size_t>(INT32_MAX)) fail(ErrorKind::kInvalidFile, "{}: vocabulary too large", f.path());

  v.type.assign(n, TokenType::kNormal);
  if (f.find("tokenizer.ggml.token_type")) {
    const gguf::Array& tt = require_array(f, "tokenizer.ggml.token_type", gguf::ValueType::kI32);
    if (tt.size() != n)
      fail(ErrorKind::kInvalidFile, "{}: tokenizer.ggml.token_type has {} entries for {} tokens", f.path(),
           tt.size(), n);
    for (size_t i = 0; i < n; ++i) {
      const int32_t t = tt.get<int32_t>(i);
      if (t < 0 || t > 6) fail(ErrorKind::kInvalidFile, "{}: token {} has unknown type {}", f.path(), i, t);
      v.type[i] = static_cast<TokenType>(t);
    }
  }
  v.score.assign(n, 0.0f);
  if (f.find("tokenizer.ggml.scores")) {
    const gguf::Array& sc = require_array(f, "tokenizer.ggml.scores", gguf::ValueType::kF32);
    if (sc.size() != n)
      fail(ErrorKind::kInvalidFile, "{}: tokenizer.ggml.scores has {} entries for {} tokens", f.path(),
           sc.size(), n);
    for (size_t i = 0; i < n; ++i) v.score[i] = sc.get<float>(i);
  }

  // Token texts, and the text each added token is matched by in the input (transformers' rules:
  // the GGUF spelling, and only where the tokenizer it builds keeps that spelling).
  std::vector<bool> keeps_spelling(n, true);
  v.text.resize(n);
  const bool byte_level = v.kind == TokenizerKind::kByteLevelBpe;
  const bool respell = v.kind == TokenizerKind::kSentencePiece && is_gemma(v.architecture);
  for (size_t i = 0; i < n; ++i) {
    const std::string& s = tokens.strings[i];
    if (byte_level) {
      auto raw = from_byte_alphabet(s);
      keeps_spelling[i] = raw.has_value();
      v.text[i] = raw ? std::move(*raw) : s;  // outside the alphabet: transformers encodes its UTF-8
    } else if (respell) {
      auto r = gemma_respelling(s);
      keeps_spelling[i] = !r.has_value();
      v.text[i] = r ? std::move(*r) : s;
    } else {
      v.text[i] = s;
    }
  }
  v.id_of.reserve(n);
  for (size_t i = 0; i < n; ++i)
    v.id_of.insert_or_assign(std::string_view(v.text[i]), static_cast<TokenId>(i));

  v.special.bos = opt_id(f, "tokenizer.ggml.bos_token_id", n);
  v.special.eos = opt_id(f, "tokenizer.ggml.eos_token_id", n);
  v.special.eot = opt_id(f, "tokenizer.ggml.eot_token_id", n);
  v.special.eom = opt_id(f, "tokenizer.ggml.eom_token_id", n);
  v.special.pad = opt_id(f, "tokenizer.ggml.padding_token_id", n);
  v.special.unk = opt_id(f, "tokenizer.ggml.unknown_token_id", n);
  if (v.special.eot == kNoToken) {
    for (std::string_view t : {"<|eot_id|>", "<end_of_turn>", "<|im_end|>", "<|end|>", "<EOT>"}) {
      const TokenId id = v.find(t);
      if (id != kNoToken && v.type[id] == TokenType::kControl) {
        v.special.eot = id;
        break;
      }
    }
  }
  v.add_bos = f.opt_bool("tokenizer.ggml.add_bos_token").value_or(v.kind == TokenizerKind::kSentencePiece);
  v.add_eos = f.opt_bool("tokenizer.ggml.add_eos_token").value_or(false);
  v.add_space_prefix = f.opt_bool("tokenizer.ggml.add_space_prefix").value_or(false);
  v.chat_template = f.opt_string("tokenizer.chat_template");

  for (size_t i = 0; i < n; ++i) {
    const bool control = v.type[i] == TokenType::kControl && keeps_spelling[i];
    const bool user = v.type[i] == TokenType::kUserDefined && keeps_spelling[i];
    if (control || user) v.added.push_back({static_cast<TokenId>(i), tokens.strings[i]});
  }

  if (byte_level) {
    // A byte without a token (SmolLM2 has none for 21 bytes, control characters and bytes that never
    // occur in UTF-8) is dropped by the encoder, as HF's BPE without an unknown token does.
    for (int b = 0; b < 256; ++b) v.byte_token[b] = v.find(std::string(1, static_cast<char>(b)));
    if (f.find("tokenizer.ggml.merges")) {
      const gguf::Array& merges = require_array(f, "tokenizer.ggml.merges", gguf::ValueType::kString);
      v.merges.reserve(merges.size());
      for (size_t r = 0; r < merges.size(); ++r) {
        const std::string& m = merges.strings[r];
        const size_t sp = m.find(' ', 1);
        const auto a =
            sp == std::string::npos ? std::nullopt : from_byte_alphabet(std::string_view(m).substr(0, sp));
        const auto b =
            sp == std::string::npos ? std::nullopt : from_byte_alphabet(std::string_view(m).substr(sp + 1));
        const TokenId ia = a ? v.find(*a) : kNoToken, ib = b ? v.find(*b) : kNoToken;
        const TokenId im = a && b ? v.find(*a + *b) : kNoToken;
        if (ia == kNoToken || ib == kNoToken || im == kNoToken)
          fail(ErrorKind::kInvalidFile, "{}: merge {} '{}' names a token that is not in the vocabulary",
               f.path(), r, m);
        v.merges.insert_or_assign(Vocab::pair_key(ia, ib), Merge{static_cast<uint32_t>(r), im});
      }
    }
  } else {
    for (int b = 0; b < 256; ++b) v.byte_token[b] = v.find(fmt::format("<0x{:02X}>", b));
  }
  return v;
}

}  // namespace kvtier::tokenizer
