// Closed sets of the tokenizer module: token ids, token types (GGUF's tokenizer.ggml.token_type),
// tokenizer algorithms (tokenizer.ggml.model) and pre-tokenisers (tokenizer.ggml.pre).
#pragma once

#include <cstdint>
#include <string_view>

namespace kvtier::tokenizer {

using TokenId = int32_t;
constexpr TokenId kNoToken = -1;

// The values of tokenizer.ggml.token_type (llama.cpp's llama_token_type).
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // BOS, EOS, <|im_start|>...: matched in text only when special parsing is asked
  kUserDefined = 4,  // always matched whole in text (Gemma's "\n\n", "<start_of_image>")
  kUnused = 5,
  kByte = 6,  // SentencePiece byte fallback "<0xAB>"
};

// tokenizer.ggml.model
enum class TokenizerKind : uint8_t {
  kByteLevelBpe,   // "gpt2": byte-level BPE with explicit merges (GPT-2, Llama-3, Qwen2, SmolLM2)
  kSentencePiece,  // "llama": SentencePiece-style BPE over code points, byte fallback (Llama-2, Gemma)
};

// tokenizer.ggml.pre (byte-level BPE only): how text is split before BPE.
enum class PreTokenizer : uint8_t {
  kGpt2,    // "gpt-2" (and "default" for a byte-level vocabulary)
  kSmollm,  // "smollm", "starcoder", "refact", "codeshell": every numeric character alone, then GPT-2
  kLlama3,  // "llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe"
  kQwen2,   // "qwen2", "deepseek-r1-qwen"
};

// How a SentencePiece vocabulary orders merges (transformers builds merges from the vocabulary).
enum class MergeOrder : uint8_t {
  kScore,       // by tokenizer.ggml.scores (Llama-2)
  kVocabOrder,  // by position in the vocabulary (Gemma: its scores do not follow merge order)
};

std::string_view tokenizer_kind_name(TokenizerKind k);
std::string_view pre_tokenizer_name(PreTokenizer p);

}  // namespace kvtier::tokenizer
