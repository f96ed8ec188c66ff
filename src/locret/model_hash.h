// The fingerprint that ties a retaining-head file to its backbone: a 64-bit hash of every byte of the
// model's GGUF file (weights, hyperparameters, tokenizer), as "fp64v1:<16 hex digits>". Not a
// cryptographic hash: it catches a head file used with another model or another quantisation.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kvtier::locret {

// 4-lane multiply-rotate hash of the bytes (any length); stable across machines.
uint64_t hash_bytes(std::span<const uint8_t> bytes);
// Maps the file and hashes it; throws Error(kIo) naming the path.
std::string model_fingerprint(const std::string& gguf_path);

}  // namespace kvtier::locret
