#include "locret/head_math.h"

#include <cmath>
#include <span>

#include "backend/cpu/matmul.h"
#include "core/error.h"

namespace kvtier::locret {
namespace {

size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

}  // namespace

template <>
void gemm_nt<float>(const Compute& c, const float* w, int64_t rows, int64_t k, const float* x, int64_t n,
                    float* y) {
  KVTIER_ASSERT(c.pool != nullptr, "float GEMMs need a thread pool");
  const cpu::WeightMatrix m{GgmlType::kF32, reinterpret_cast<const uint8_t*>(w), rows, k};
  KVTIER_ASSERT(cpu::matmul_scratch_bytes(GgmlType::kF32, k, n) == 0);
  cpu::matmul(*c.pool, c.isa, m, x, n, y, {});
}

template <>
void gemm_nt<double>(const Compute&, const double* w, int64_t rows, int64_t k, const double* x, int64_t n,
                     double* y) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0.0;
      for (int64_t i = 0; i < k; ++i) s += w[r * k + i] * x[t * k + i];
      y[t * rows + r] = s;
    }
  }
}

template <typename T>
void transpose(const T* src, int64_t rows, int64_t cols, T* dst) {
  constexpr int64_t kB = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kB) {
    for (int64_t c0 = 0; c0 < cols; c0 += kB) {
      const int64_t r1 = std::min(rows, r0 + kB);
      const int64_t c1 = std::min(cols, c0 + kB);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t col = c0; col < c1; ++col) dst[col * rows + r] = src[r * cols + col];
      }
    }
  }
}

template <typename T>
T activate(HeadActivation act, T z) {
  if (act == HeadActivation::kSilu) return z / (T(1) + std::exp(-z));
  if (act == HeadActivation::kRelu) return z > T(0) ? z : T(0);
  const T c = T(0.7978845608028654);  // sqrt(2 / pi)
  return T(0.5) * z * (T(1) + std::tanh(c * (z + T(0.044715) * z * z * z)));
}

template <typename T>
T activate_grad(HeadActivation act, T z) {
  if (act == HeadActivation::kSilu) {
    const T s = T(1) / (T(1) + std::exp(-z));
    return s * (T(1) + z * (T(1) - s));
  }
  if (act == HeadActivation::kRelu) return z > T(0) ? T(1) : T(0);
  const T c = T(0.7978845608028654);
  const T th = std::tanh(c * (z + T(0.044715) * z * z * z));
  return T(0.5) * (T(1) + th) + T(0.5) * z * (T(1) - th * th) * c * (T(1) + T(3 * 0.044715) * z * z);
}

template <typename T>
void assemble_features(const LayerShape& s, const float* q_pre, const float* k_pre, const float* v, int64_t n,
                       T* X) {
  const int64_t qd = s.q_dim(), kd = s.k_dim(), vd = s.v_dim(), d = s.d_in();
  for (int64_t t = 0; t < n; ++t) {
    T* x = X + t * d;
    for (int64_t i = 0; i < qd; ++i) x[i] = static_cast<T>(q_pre[t * qd + i]);
    for (int64_t i = 0; i < kd; ++i) x[qd + i] = static_cast<T>(k_pre[t * kd + i]);
    for (int64_t i = 0; i < vd; ++i) x[qd + kd + i] = static_cast<T>(v[t * vd + i]);
  }
}

template <typename T>
void head_forward(const Compute& c, const LayerShape& s, int64_t d_m, HeadActivation act,
                  const LayerParams<T>& w, const T* X, int64_t n, T* z, T* a, T* p) {
  KVTIER_ASSERT(w.fc1.size() == sz(d_m * s.d_in()) && w.fc2.size() == sz(s.n_head_kv * d_m),
                "retaining head of {} + {} weights for d_in {}, d_m {}, h_kv {}", w.fc1.size(), w.fc2.size(),
                s.d_in(), d_m, s.n_head_kv);
  gemm_nt(c, w.fc1.data(), d_m, s.d_in(), X, n, z);
  for (int64_t i = 0; i < n * d_m; ++i) a[i] = activate(act, z[i]);
  gemm_nt(c, w.fc2.data(), s.n_head_kv, d_m, a, n, p);
}

template <typename T>
void head_backward(const Compute& c, const LayerShape& s, int64_t d_m, HeadActivation act,
                   const LayerParams<T>& w, const T* X, int64_t n, const T* z, const T* a, const T* dp,
                   LayerParams<T>& grad, BackwardScratch<T>& sc) {
  const int64_t hk = s.n_head_kv, din = s.d_in();
  grad.fc1.resize(sz(d_m * din));
  grad.fc2.resize(sz(hk * d_m));
  sc.xt.resize(sz(din * n));
  sc.dz.resize(sz(n * d_m));
  sc.dzt.resize(sz(d_m * n));
  sc.at.resize(sz(d_m * n));
  sc.dpt.resize(sz(hk * n));
  // dfc2[j, m] = sum_t dP[t, j] A[t, m]
  transpose(a, n, d_m, sc.at.data());
  transpose(dp, n, hk, sc.dpt.data());
  gemm_nt(c, sc.at.data(), d_m, n, sc.dpt.data(), hk, grad.fc2.data());
  // dZ[t, m] = (sum_j dP[t, j] fc2[j, m]) act'(Z[t, m])
  for (int64_t t = 0; t < n; ++t) {
    T* dzr = sc.dz.data() + t * d_m;
    for (int64_t m = 0; m < d_m; ++m) dzr[m] = T(0);
    for (int64_t j = 0; j < hk; ++j) {
      const T g = dp[t * hk + j];
      const T* f = w.fc2.data() + j * d_m;
      for (int64_t m = 0; m < d_m; ++m) dzr[m] += g * f[m];
    }
    for (int64_t m = 0; m < d_m; ++m) dzr[m] *= activate_grad(act, z[t * d_m + m]);
  }
  // dfc1[m, i] = sum_t dZ[t, m] X[t, i]
  transpose(X, n, din, sc.xt.data());
  transpose(sc.dz.data(), n, d_m, sc.dzt.data());
  gemm_nt(c, sc.xt.data(), din, n, sc.dzt.data(), d_m, grad.fc1.data());
}

#define KVTIER_LOCRET_INSTANTIATE(T)                                                                       \
  template void transpose<T>(const T*, int64_t, int64_t, T*);                                              \
  template T activate<T>(HeadActivation, T);                                                               \
  template T activate_grad<T>(HeadActivation, T);                                                          \
  template void assemble_features<T>(const LayerShape&, const float*, const float*, const float*, int64_t, \
                                     T*);                                                                  \
  template void head_forward<T>(const Compute&, const LayerShape&, int64_t, HeadActivation,                \
                                const LayerParams<T>&, const T*, int64_t, T*, T*, T*);                     \
  template void head_backward<T>(const Compute&, const LayerShape&, int64_t, HeadActivation,               \
                                 const LayerParams<T>&, const T*, int64_t, const T*, const T*, const T*,   \
                                 LayerParams<T>&, BackwardScratch<T>&);

KVTIER_LOCRET_INSTANTIATE(float)
KVTIER_LOCRET_INSTANTIATE(double)

}  // namespace kvtier::locret
