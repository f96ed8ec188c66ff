#include "runtime/model_files.h"

namespace kvtier::runtime {

std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& opt) {
  auto m = std::make_unique<LoadedModel>();
  m->file = std::make_unique<gguf::File>(path);
  m->hparams = model::read_hparams(*m->file);
  m->config = model::make_config(m->hparams);
  m->weights = model::load_weights(*m->file, m->config);
  if (opt.cpu_isa && cpu::isa_supported(*opt.cpu_isa)) {
    // Where every product with the output matrix reads its copy, its mapped pages are handed back
    // as the copy is made (before the layers' copies are made, so that the two never stand side by
    // side); a tied embedding looks its rows up in the copy too (tok_embd.lanes), so they stay out
    // of memory.
    model::pack_output_lanes(m->weights, *opt.cpu_isa, m->file.get());
    if (opt.pack_layers) model::pack_layer_lanes(m->weights, *opt.cpu_isa, m->file.get());
  }
  m->tokenizer = std::make_unique<tokenizer::Tokenizer>(*m->file);
  return m;
}

}  // namespace kvtier::runtime
