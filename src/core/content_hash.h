// The project's one content hash: XXH3-64 (libxxhash). It ties sidecar files (skewing matrices,
// retaining heads) to the exact model file they were made from, names training data in head
// metadata, and digests logits rows for the exactness checks. Not cryptographic: it catches a file
// used with another model or another quantisation, not an adversary.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kvtier {

// XXH3-64 (seed 0) of the bytes; stable across machines and runs.
uint64_t xxh3_64(std::span<const uint8_t> bytes);
// The same over a float row's bytes (native little-endian layout).
uint64_t xxh3_64(std::span<const float> values);
// "xxh3-64:<16 hex digits>": the tagged form sidecar files store.
std::string xxh3_tag(std::span<const uint8_t> bytes);
// Maps the file and returns xxh3_tag of its whole contents; throws Error(kIo) naming the path.
std::string file_xxh3_tag(const std::string& path);

}  // namespace kvtier
