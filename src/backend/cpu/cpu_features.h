// Run-time CPU feature detection and the SIMD paths (ISAs) the CPU kernels have.
// The binary is built for baseline x86-64 plus per-file AVX2 / AVX-512 code; a path is only ever
// called when the running CPU reports every feature its translation unit was compiled with.
#pragma once

#include <optional>
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
  // AMX-INT8 tiles usable by this process: the CPU has AMX-TILE and AMX-INT8, and Linux granted the
  // process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once at detection). Only the
  // AVX-512 table uses them (matmul_amx.cpp), for outputs with the same bits as its vector tiles.
  bool amx_int8 = false;
};

// Detected once (CPUID + OS support of the wider registers and of AMX's tile state), then constant.
const CpuFeatures& cpu_features();

bool isa_supported(Isa isa);
// Fails (ErrorKind::kUnsupported) unless `isa` is supported, with one message everywhere: "this CPU
// does not support the <isa> kernels", the features they need and the widest path this CPU has.
void require_isa(Isa isa);
// The widest supported path.
Isa best_isa();
// Whether `isa`'s matmul tiles use AMX-INT8 on this CPU (the AVX-512 path where amx_int8).
bool uses_amx(Isa isa);
std::string_view isa_name(Isa isa);
// The path isa_name spells `name` ("scalar", "avx2", "avx512"), or nothing.
std::optional<Isa> isa_from_name(std::string_view name);
// The processor's brand string (CPUID leaves 0x80000002..4, trimmed), "unknown" where there is none.
std::string cpu_brand();

}  // namespace kvtier::cpu
