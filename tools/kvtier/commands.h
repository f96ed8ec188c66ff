// Subcommands of the kvtier CLI. Each registers its flags on the app and returns a runner.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace kvtier::cli {

using Runner = std::function<int()>;

// A flag that must be a number greater than 0. (CLI11's PositiveNumber refuses 0 as "not in range
// 0.000000 to 1.797...e308"; this one says "--gen: must be greater than 0, not 0".)
CLI::Validator positive();
// A flag that must be a number, 0 or more ("--ctx: must be 0 or more, not -5").
CLI::Validator non_negative();
// A file to write: its directory must exist, checked before the work that produces it
// ("--output: the directory '/no/such' does not exist").
CLI::Validator output_file();

// Registers `kvtier inspect`; `run` is set to the command's body.
void add_inspect(CLI::App& app, Runner& run);
void add_synth(CLI::App& app, Runner& run);
// Registers `kvtier tokenize` and `kvtier detokenize`.
void add_tokenize(CLI::App& app, Runner& run);
// Registers `kvtier run` (generation), `chat`, `perplexity` and `bench`.
void add_run(CLI::App& app, Runner& run);
void add_chat(CLI::App& app, Runner& run);
void add_perplexity(CLI::App& app, Runner& run);
void add_bench(CLI::App& app, Runner& run);
// Registers `kvtier eval` (long-context accuracy of KV policies).
void add_eval(CLI::App& app, Runner& run);
// Registers `kvtier compare` (the policy sweep) and `compare-report`.
void add_compare(CLI::App& app, Runner& run);
void add_plan(CLI::App& app, Runner& run);
// Registers `kvtier policies` (KV policy presets, axes and values).
void add_policies(CLI::App& app, Runner& run);
// Registers `kvtier skew` (InfiniGen's skewing matrices).
void add_skew(CLI::App& app, Runner& run);
// Registers `kvtier serve` (OpenAI-compatible HTTP server).
void add_serve(CLI::App& app, Runner& run);
// Registers `kvtier profile` (KVPR's profiler: link bandwidth, projection rate; cached).
void add_profile(CLI::App& app, Runner& run);
// Registers `kvtier train-locret` (Locret retaining heads) and `locret-fixture` (its test model).
void add_train_locret(CLI::App& app, Runner& run);
void add_locret_fixture(CLI::App& app, Runner& run);
void add_locret_data(CLI::App& app, Runner& run);

}  // namespace kvtier::cli
