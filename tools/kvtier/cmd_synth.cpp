// kvtier synth --preset NAME -o out.gguf: a GGUF with random weights of a known model's shape.
#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "model/presets.h"
#include "model/synthetic.h"

namespace kvtier::cli {
namespace {

struct SynthArgs {
  std::string preset;
  std::string out;
  std::string type = "f16";
  uint64_t seed = 0;
  uint32_t layers = 0;
  uint32_t ctx = 0;
  bool list = false;
};

int run_synth(const SynthArgs& a) {
  if (a.list) {
    for (const auto& p : model::all_presets()) std::cout << fmt::format("{:<14} {}\n", p.name, p.description);
    return 0;
  }
  if (a.preset.empty() || a.out.empty()) fail(ErrorKind::kInvalidArgument, "synth needs --preset and -o");
  const auto preset = model::find_preset(a.preset);
  if (!preset) {
    std::string names;
    for (const auto& p : model::all_presets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
    fail(ErrorKind::kInvalidArgument, "unknown preset '{}' (known: {})", a.preset, names);
  }
  model::SynthOptions opts;
  const auto type = ggml_type_from_name(a.type);
  if (!type) fail(ErrorKind::kInvalidArgument, "unknown type '{}'", a.type);
  opts.type = *type;
  opts.seed = a.seed;
  opts.n_layer = a.layers;
  opts.n_ctx = a.ctx;
  const gguf::Writer w = model::synth_writer(*preset, opts);
  const uint64_t total = w.file_size();
  const bool tty = stderr_is_tty();
  std::cerr << fmt::format("kvtier synth: {} ({}), {} -> {} ({})\n", preset->name, preset->description,
                           a.type, a.out, human_bytes(total));
  const auto t0 = std::chrono::steady_clock::now();
  w.write(a.out, [&](size_t done, size_t n, uint64_t bytes) {
    throw_if_interrupted();
    if (tty) {
      std::cerr << fmt::format("\r  tensor {}/{}  {} / {}  ({:.0f}%)   ", done, n, human_bytes(bytes),
                               human_bytes(total),
                               100.0 * static_cast<double>(bytes) / static_cast<double>(total));
    }
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (tty) std::cerr << "\n";
  std::cerr << fmt::format("kvtier synth: wrote {} in {:.1f} s\n", a.out, s);
  return 0;
}

}  // namespace

void add_synth(CLI::App& app, Runner& run) {
  auto a = std::make_shared<SynthArgs>();
  auto* cmd = app.add_subcommand("synth", "Write a GGUF model with random weights of a preset shape");
  cmd->add_option("--preset", a->preset, "Preset shape (see --list)");
  cmd->add_option("-o,--output", a->out, "Output GGUF path (written atomically)");
  cmd->add_option("--type", a->type, "Type of the weight matrices: f32, f16, bf16, q8_0, q4_0, q4_1")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Random seed (weights are a function of seed and tensor name)")
      ->capture_default_str();
  cmd->add_option("--layers", a->layers, "Number of layers (default: the preset's)")
      ->check(CLI::Range(1u, 100000u));
  cmd->add_option("--ctx", a->ctx, "Trained context length written to the file (default: the preset's)")
      ->check(CLI::Range(1u, 0x7fffffffu));
  cmd->add_flag("--list", a->list, "List the presets and exit");
  cmd->callback([a, &run] { run = [a] { return run_synth(*a); }; });
}

}  // namespace kvtier::cli
