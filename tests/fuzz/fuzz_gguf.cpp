// libFuzzer entry point: any byte string must parse or be rejected with kvtier::Error.
// Run: cmake --preset fuzz && cmake --build --preset fuzz --target fuzz_gguf &&
//      build/fuzz/tests/fuzz/fuzz_gguf -max_total_time=600 CORPUS_DIR tests/fuzz/seeds
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "gguf/reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto content = kvtier::gguf::parse(std::span<const uint8_t>(data, size), "fuzz");
    // Touch what a caller would use, so the sanitizers see any bad pointer.
    size_t sum = 0;
    for (const auto& t : content.tensors) {
      if (t.n_bytes > 0) sum += t.data[0] + t.data[t.n_bytes - 1];
    }
    for (const auto& kv : content.metadata) sum += kv.key.size();
    return static_cast<int>(sum & 0);
  } catch (const kvtier::Error&) {
    return 0;
  }
}
