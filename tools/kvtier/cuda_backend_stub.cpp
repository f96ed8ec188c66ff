// cuda_backend.h in a build without the CUDA backend: a clear error instead of a missing flag.
#include "core/error.h"
#include "cuda_backend.h"

namespace kvtier::cli {
namespace {

[[noreturn]] void no_cuda() {
  fail(ErrorKind::kUnsupported,
       "--backend cuda: this kvtier was built without the CUDA backend (configure with `cmake --preset "
       "cuda`)");
}

}  // namespace

int run_generate_cuda(const EngineArgs&, const runtime::LoadedModel&, std::span<const runtime::TokenId>,
                      const runtime::SamplerParams&, const CudaRunArgs&) {
  no_cuda();
}

int run_bench_cuda(const EngineArgs&, const CudaBenchArgs&) {
  no_cuda();
}

}  // namespace kvtier::cli
