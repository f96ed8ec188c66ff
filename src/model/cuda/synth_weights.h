// In-memory synthetic models on the device (`--model synthetic:llama3-8b`): the hyper-parameters of
// a preset, and its weights generated on the device from the seed (backend/cuda/synth.h), with no
// file and no host copy. Values are those of model/synthetic.h rounded to bf16, so a device-made
// model computes what an f32 synthetic GGUF of the same preset and seed computes once uploaded.
#pragma once

#include "backend/cuda/context.h"
#include "kv/ledger.h"
#include "model/config.h"
#include "model/cuda/device_weights.h"
#include "model/hparams.h"
#include "model/presets.h"
#include "model/synthetic.h"

namespace kvtier::model_cuda {

// The hyper-parameters synth_writer writes for this preset (o.n_layer / o.n_ctx override it).
model::Hparams preset_hparams(const model::Preset& p, const model::SynthOptions& o);

// Generates every tensor of synth_tensors(p, o) in the context's arena (counted in the ledger as
// device weights); blocks until done.
DeviceWeights synth_device_weights(cuda::Context& ctx, const model::Preset& p, const model::SynthOptions& o,
                                   kv::MemoryLedger& ledger);

}  // namespace kvtier::model_cuda
