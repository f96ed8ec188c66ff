#include "locret/labels.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace kvtier::locret {

void cis_labels(const LabelInputs& in, float* Y) {
  KVTIER_ASSERT(in.n_answer > 0 && in.n_prompt > 0 && in.n_head_kv > 0 && in.n_head % in.n_head_kv == 0,
                "labels of {} answer and {} prompt tokens, {} / {} heads", in.n_answer, in.n_prompt,
                in.n_head, in.n_head_kv);
  const int64_t g = in.n_head / in.n_head_kv;
  const int64_t d = in.head_dim;
  for (int64_t j = 0; j < in.n_head_kv; ++j) {
    for (int64_t k = 0; k < in.n_prompt; ++k) {
      const float* kr = in.k_prompt + (k * in.n_head_kv + j) * d;
      double best = -std::numeric_limits<double>::infinity();
      for (int64_t p = 0; p < in.n_answer; ++p) {
        for (int64_t i = j * g; i < (j + 1) * g; ++i) {
          const float* qr = in.q_answer + (p * in.n_head + i) * d;
          double s = 0.0;
          for (int64_t e = 0; e < d; ++e) s += static_cast<double>(qr[e]) * kr[e];
          s *= in.scale;
          if (in.softcap > 0.0f) s = in.softcap * std::tanh(s / in.softcap);
          best = std::max(best, s);
        }
      }
      Y[j * in.n_prompt + k] = static_cast<float>(best);
    }
  }
}

}  // namespace kvtier::locret
