#include "runtime/model_files.h"

namespace kvtier::runtime {

std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& opt) {
  auto m = std::make_unique<LoadedModel>();
  m->file = std::make_unique<gguf::File>(path);
  m->hparams = model::read_hparams(*m->file);
  m->config = model::make_config(m->hparams);
  m->weights = model::load_weights(*m->file, m->config);
  if (opt.cpu_isa && cpu::isa_supported(*opt.cpu_isa)) {
    if (model::pack_output_lanes(m->weights, *opt.cpu_isa)) {
      // Every product with the output matrix reads its copy, so its mapped pages are handed back
      // (before the layers' copies are made, so that the two never stand side by side); a tied
      // embedding looks its rows up in the copy too (tok_embd.lanes), so they stay out of memory.
      const cpu::WeightMatrix& o = m->weights.output;
      const uint64_t row = *ggml_row_bytes(o.type, static_cast<uint64_t>(o.k));
      m->file->drop_pages({o.data, static_cast<size_t>(row * static_cast<uint64_t>(o.n_rows))});
    }
    if (opt.pack_layers) model::pack_layer_lanes(m->weights, *opt.cpu_isa, m->file.get());
  }
  m->tokenizer = std::make_unique<tokenizer::Tokenizer>(*m->file);
  return m;
}

}  // namespace kvtier::runtime
