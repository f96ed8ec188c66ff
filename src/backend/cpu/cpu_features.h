// Run-time CPU feature detection and the SIMD paths (ISAs) the CPU kernels have.
// The binary is built for baseline x86-64 plus per-file AVX2 / AVX-512 code; a path is only ever
// called when the running CPU reports every feature its translation unit was compiled with.
#pragma once

#include <string>
#include <string_view>

namespace kvtier::cpu {

enum class Isa {
  kScalar,  // portable C++, the reference
  kAvx2,    // AVX2 + FMA + F16C
  kAvx512,  // AVX-512 F/BW/VL + VNNI (plus the AVX2 set)
};

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
};

// Detected once (CPUID + OS support of the wider registers), then constant.
const CpuFeatures& cpu_features();

bool isa_supported(Isa isa);
// The widest supported path.
Isa best_isa();
std::string_view isa_name(Isa isa);
// The processor's brand string (CPUID leaves 0x80000002..4, trimmed), "unknown" where there is none.
std::string cpu_brand();

}  // namespace kvtier::cpu
