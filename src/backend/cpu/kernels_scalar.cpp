#include "backend/cpu/kernels.h"
#include "backend/cpu/quantize_act.h"
#include "backend/cpu/ref_kernels.h"

namespace kvtier::cpu {

void fill_scalar_kernels(KernelTable& t) {
  auto set = [&t](GgmlType type, VecDotFn fn) { t.vec_dot[static_cast<size_t>(type)] = fn; };
  set(GgmlType::kF32, ref::dot_f32);
  set(GgmlType::kF16, ref::dot_f16);
  set(GgmlType::kBF16, ref::dot_bf16);
  set(GgmlType::kQ4_0, ref::dot_q4_0);
  set(GgmlType::kQ4_1, ref::dot_q4_1);
  set(GgmlType::kQ5_0, ref::dot_q5_0);
  set(GgmlType::kQ5_1, ref::dot_q5_1);
  set(GgmlType::kQ8_0, ref::dot_q8_0);
  set(GgmlType::kQ2_K, ref::dot_q2_k);
  set(GgmlType::kQ3_K, ref::dot_q3_k);
  set(GgmlType::kQ4_K, ref::dot_q4_k);
  set(GgmlType::kQ5_K, ref::dot_q5_k);
  set(GgmlType::kQ6_K, ref::dot_q6_k);
  t.quantize_act[static_cast<size_t>(ActFormat::kQ8_32)] = ref::quantize_q8_32;
  t.quantize_act[static_cast<size_t>(ActFormat::kQ8_32Min)] = ref::quantize_q8_32_min;
  t.quantize_act[static_cast<size_t>(ActFormat::kQ8_K)] = ref::quantize_q8_k;
  t.fops = FloatKernels{ref::rms_norm, ref::layer_norm, ref::silu, ref::gelu_tanh,  ref::relu,
                        ref::softmax,  ref::add,        ref::mul,  ref::rope_rotate};
}

}  // namespace kvtier::cpu
