// Writes the all-value-types GGUF fixture to argv[1] (for the Python reference test).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "fixtures.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gguf_write_fixture OUT.gguf [ALIGNMENT]\n");
    return 2;
  }
  try {
    const uint32_t align = argc > 2 ? static_cast<uint32_t>(std::stoul(argv[2])) : 32;
    kvtier::gguf::testing::all_types_writer(align).write(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_write_fixture: %s\n", e.what());
    return 1;
  }
  return 0;
}
