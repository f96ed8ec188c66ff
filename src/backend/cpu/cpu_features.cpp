#include "backend/cpu/cpu_features.h"

#include "core/error.h"

#include <cstring>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvtier::cpu {
namespace {

// CPUID leaf 7 reports AMX-TILE and AMX-INT8, and Linux lets this process use the tile data state.
// A process must ask for it (the state is 8 KiB per thread); the grant covers all its threads.
bool amx_int8_usable() {
#if defined(__linux__) && defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool tile = (edx >> 24) & 1u, int8 = (edx >> 25) & 1u;
  if (!tile || !int8) return false;
  constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: request permission for an xstate feature
  constexpr long kXfeatureXtiledata = 18;     // the AMX tile data
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports checks CPUID and that the OS saves the registers (XGETBV).
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  f.amx_int8 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && amx_int8_usable();
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return avx2;
    case Isa::kAvx512:
      return avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
  }
  return false;
}

void require_isa(Isa isa) {
  if (isa_supported(isa)) return;
  const std::string_view needs =
      isa == Isa::kAvx512 ? "AVX2, FMA, F16C, AVX-512 F/BW/VL and AVX-512 VNNI" : "AVX2, FMA and F16C";
  fail(ErrorKind::kUnsupported,
       "this CPU does not support the {} kernels (they need {}); the widest path here is {}", isa_name(isa),
       needs, isa_name(best_isa()));
}

Isa best_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

bool uses_amx(Isa isa) {
  return isa == Isa::kAvx512 && cpu_features().amx_int8;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (isa_name(isa) == name) return isa;
  return std::nullopt;
}

std::string cpu_brand() {
  std::string brand;
#if defined(__x86_64__) || defined(__i386__)
  unsigned regs[12] = {};
  unsigned max_leaf = __get_cpuid_max(0x80000000u, nullptr);
  if (max_leaf >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i)
      __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char text[sizeof(regs) + 1] = {};
    std::memcpy(text, regs, sizeof(regs));
    brand = text;
  }
#endif
  const size_t b = brand.find_first_not_of(' ');
  const size_t e = brand.find_last_not_of(' ');
  if (b == std::string::npos) return "unknown";
  return brand.substr(b, e - b + 1);
}

}  // namespace kvtier::cpu
