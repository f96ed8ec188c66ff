// kvtier inspect MODEL [--json] [--tensors]: what a GGUF file holds and what it costs to run.
#include <fmt/format.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "gguf_json.h"
#include "model/hparams.h"

namespace kvtier::cli {
namespace {

struct InspectArgs {
  std::string model;
  bool json = false;
  bool tensors = false;
};

struct TypeTotals {
  uint64_t count = 0;
  uint64_t elements = 0;
  uint64_t bytes = 0;
};

nlohmann::ordered_json hparams_json(const model::Hparams& hp) {
  nlohmann::ordered_json j;
  j["n_layer"] = hp.n_layer;
  j["n_embd"] = hp.n_embd;
  j["n_ff"] = hp.n_ff;
  j["n_head"] = hp.n_head;
  if (hp.uniform_kv_heads()) {
    j["n_head_kv"] = hp.n_head_kv.front();
  } else {
    j["n_head_kv"] = hp.n_head_kv;
  }
  j["head_dim_k"] = hp.head_dim_k;
  j["head_dim_v"] = hp.head_dim_v;
  j["n_ctx_train"] = hp.n_ctx_train;
  j["n_vocab"] = hp.n_vocab;
  j["rope_freq_base"] =
      hp.rope_freq_base ? nlohmann::ordered_json(*hp.rope_freq_base) : nlohmann::ordered_json(nullptr);
  j["rms_eps"] = hp.rms_eps ? nlohmann::ordered_json(*hp.rms_eps) : nlohmann::ordered_json(nullptr);
  j["sliding_window"] =
      hp.sliding_window ? nlohmann::ordered_json(*hp.sliding_window) : nlohmann::ordered_json(nullptr);
  return j;
}

int run_inspect(const InspectArgs& args) {
  const gguf::File file(args.model);

  std::optional<model::Hparams> hp;
  std::string hp_error;
  try {
    hp = model::read_hparams(file);
  } catch (const Error& e) {
    hp_error = e.what();
  }

  std::map<std::string, TypeTotals> by_type;
  uint64_t n_params = 0, weight_bytes = 0;
  for (const auto& t : file.tensors()) {
    auto& tt = by_type[std::string(ggml_type_name(t.type))];
    ++tt.count;
    tt.elements += t.n_elements;
    tt.bytes += t.n_bytes;
    n_params += t.n_elements;
    weight_bytes += t.n_bytes;
  }
  const auto tok_model = file.opt_string("tokenizer.ggml.model");
  const auto tok_pre = file.opt_string("tokenizer.ggml.pre");
  const std::string arch = file.opt_string("general.architecture").value_or("");

  if (args.json) {
    nlohmann::ordered_json j;
    j["file"] = file.path();
    j["file_size"] = file.file_size();
    j["version"] = file.version();
    j["alignment"] = file.alignment();
    j["data_offset"] = file.data_offset();
    j["architecture"] = arch;
    j["name"] = file.opt_string("general.name").value_or("");
    if (hp) {
      j["hparams"] = hparams_json(*hp);
      j["kv_bytes_per_token_f16"] = hp->kv_bytes_per_token(2);
    } else {
      j["hparams"] = nullptr;
      j["hparams_error"] = hp_error;
    }
    j["tokenizer"] = {
        {"model", tok_model ? nlohmann::ordered_json(*tok_model) : nlohmann::ordered_json(nullptr)},
        {"pre", tok_pre ? nlohmann::ordered_json(*tok_pre) : nlohmann::ordered_json(nullptr)}};
    j["tensor_count"] = file.tensors().size();
    j["n_params"] = n_params;
    j["weight_bytes"] = weight_bytes;
    auto types = nlohmann::ordered_json::object();
    for (const auto& [name, tt] : by_type) {
      types[name] = {{"count", tt.count}, {"elements", tt.elements}, {"bytes", tt.bytes}};
    }
    j["tensor_types"] = types;
    auto meta = nlohmann::ordered_json::object();
    for (const auto& kv : file.metadata()) meta[kv.key] = value_to_json(kv.value);
    j["metadata"] = meta;
    auto tensors = nlohmann::ordered_json::array();
    for (const auto& t : file.tensors()) {
      tensors.push_back({{"name", t.name},
                         {"type", std::string(ggml_type_name(t.type))},
                         {"ne", t.ne},
                         {"offset", t.offset},
                         {"n_bytes", t.n_bytes}});
    }
    j["tensors"] = tensors;
    std::cout << j.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return 0;
  }

  std::cout << fmt::format("file:          {} ({}, GGUF v{}, alignment {})\n", file.path(),
                           human_bytes(file.file_size()), file.version(), file.alignment());
  std::cout << fmt::format(
      "architecture:  {}{}\n", arch.empty() ? "(none)" : arch,
      file.opt_string("general.name") ? "  (" + *file.opt_string("general.name") + ")" : "");
  if (hp) {
    std::string kv_heads = hp->uniform_kv_heads() ? std::to_string(hp->n_head_kv.front()) : "per-layer";
    std::cout << fmt::format("layers:        {}\n", hp->n_layer);
    std::cout << fmt::format("embedding:     {}   ffn: {}\n", hp->n_embd, hp->n_ff);
    std::cout << fmt::format("heads:         {} query / {} KV, head dim {} (K) {} (V)\n", hp->n_head,
                             kv_heads, hp->head_dim_k, hp->head_dim_v);
    std::cout << fmt::format("context:       {} (trained)\n", hp->n_ctx_train);
    std::cout << fmt::format("vocabulary:    {}\n", hp->n_vocab);
    if (hp->rope_freq_base) std::cout << fmt::format("rope base:     {}\n", *hp->rope_freq_base);
    if (hp->rms_eps) std::cout << fmt::format("rms eps:       {}\n", *hp->rms_eps);
    if (hp->sliding_window) std::cout << fmt::format("sliding win:   {}\n", *hp->sliding_window);
    const uint64_t kvb = hp->kv_bytes_per_token(2);
    std::cout << fmt::format("KV per token:  {} bytes (f16 K+V, all layers); {} at the trained context\n",
                             kvb, human_bytes(kvb * hp->n_ctx_train));
  } else {
    std::cout << fmt::format("hparams:       unavailable: {}\n", hp_error);
  }
  std::cout << fmt::format("tokenizer:     {}{}\n", tok_model.value_or("(none)"),
                           tok_pre ? " (pre: " + *tok_pre + ")" : "");
  std::cout << fmt::format("parameters:    {} ({:.1f} M)\n", n_params, static_cast<double>(n_params) / 1e6);
  std::cout << fmt::format("weights:       {} in {} tensors\n", human_bytes(weight_bytes),
                           file.tensors().size());
  for (const auto& [name, tt] : by_type) {
    std::cout << fmt::format("  {:<8} {:>5} tensors  {:>12}\n", name, tt.count, human_bytes(tt.bytes));
  }
  std::cout << fmt::format("metadata:      {} keys\n", file.metadata().size());
  for (const auto& kv : file.metadata()) {
    std::cout << fmt::format("  {} = {}\n", kv.key, value_to_text(kv.value));
  }
  if (args.tensors) {
    std::cout << "tensors:\n";
    for (const auto& t : file.tensors()) {
      std::string shape;
      for (size_t d = 0; d < t.ne.size(); ++d) shape += (d ? " x " : "") + std::to_string(t.ne[d]);
      std::cout << fmt::format("  {:<40} {:<6} [{}]  {}\n", t.name, ggml_type_name(t.type), shape,
                               human_bytes(t.n_bytes));
    }
  }
  return 0;
}

}  // namespace

void add_inspect(CLI::App& app, Runner& run) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd =
      app.add_subcommand("inspect", "Show a GGUF model's architecture, sizes, tokenizer and metadata");
  cmd->add_option("model", args->model, "GGUF file")->required();
  cmd->add_flag("--json", args->json, "Print one JSON object (all metadata in full, every tensor)");
  cmd->add_flag("--tensors", args->tensors, "Also list every tensor (text output)");
  cmd->callback([args, &run] { run = [args] { return run_inspect(*args); }; });
}

}  // namespace kvtier::cli
