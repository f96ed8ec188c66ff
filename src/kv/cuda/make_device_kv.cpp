#include "kv/cuda/make_device_kv.h"

#include "core/error.h"
#include "kv/cuda/offload_device_kv.h"
#include "kv/cuda/resident_device_kv.h"

namespace kvtier::kv_cuda {

std::unique_ptr<DeviceKvCache> make_device_kv(cuda::Context& ctx, const DeviceKvShape& shape,
                                              const DeviceKvOptions& opt, kv::MemoryLedger& ledger) {
  if (shape.n_head_kv.empty() || shape.head_dim == 0 || shape.max_positions <= 0) {
    fail(ErrorKind::kInvalidArgument, "empty KV shape for the CUDA KV cache");
  }
  switch (opt.placement.placement) {
    case policy::Placement::kResident:
      return std::make_unique<ResidentDeviceKv>(ctx, shape, ledger);
    case policy::Placement::kLayer:
    case policy::Placement::kHeadInfer:
      return std::make_unique<OffloadDeviceKv>(ctx, shape, opt, ledger);
  }
  fail(ErrorKind::kUnsupported, "KV placement {} on the CUDA backend",
       policy::placement_name(opt.placement.placement));
}

uint64_t device_kv_host_bytes(const DeviceKvShape& shape, const DeviceKvOptions& opt) {
  return opt.placement.placement == policy::Placement::kResident ? 0 : offload_host_bytes(shape);
}

}  // namespace kvtier::kv_cuda
