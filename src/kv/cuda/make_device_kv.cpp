#include "kv/cuda/make_device_kv.h"

#include "core/error.h"
#include "kv/cuda/device_speculator.h"
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
      if (opt.selection != policy::Selection::kAll) {
        fail(ErrorKind::kUnsupported, "selection {} on the CUDA backend needs the layer placement",
             policy::selection_name(opt.selection));
      }
      return std::make_unique<ResidentDeviceKv>(ctx, shape, ledger);
    case policy::Placement::kLayer:
    case policy::Placement::kHeadInfer:
      return std::make_unique<OffloadDeviceKv>(ctx, shape, opt, ledger);
  }
  fail(ErrorKind::kUnsupported, "KV placement {} on the CUDA backend",
       policy::placement_name(opt.placement.placement));
}

uint64_t device_kv_host_bytes(const DeviceKvShape& shape, const DeviceKvOptions& opt) {
  if (opt.placement.placement == policy::Placement::kResident) return 0;
  return offload_host_bytes(shape) +
         (opt.selection == policy::Selection::kInfinigen ? DeviceSpeculator::pinned_bytes(shape) : 0);
}

}  // namespace kvtier::kv_cuda
