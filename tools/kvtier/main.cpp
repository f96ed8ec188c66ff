// The kvtier command-line tool. The only place that reads argv (and, later, the environment).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <new>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace kvtier;
  CLI::App app{"kvtier: long-context LLM inference with a tiered KV cache (GPU / host DRAM / disk)",
               "kvtier"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvtier 0.1.0");
  cli::Runner run;
  cli::add_inspect(app, run);
  cli::add_synth(app, run);
  cli::add_tokenize(app, run);
  cli::add_run(app, run);
  cli::add_chat(app, run);
  cli::add_perplexity(app, run);
  cli::add_bench(app, run);
  cli::add_eval(app, run);
  cli::add_compare(app, run);
  cli::add_plan(app, run);
  cli::add_policies(app, run);
  cli::add_serve(app, run);
  cli::add_profile(app, run);
  cli::add_skew(app, run);
  cli::add_train_locret(app, run);
  cli::add_locret_fixture(app, run);
  cli::add_locret_data(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (
      const Error& e) {  // a flag's value refused by its parser (--kv-pool-eviction bogus): a usage error
    std::fprintf(stderr, "kvtier: error: %s\n", e.what());
    return 2;
  }
  cli::install_interrupt_handlers();
  try {
    return run ? run() : 2;
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInterrupted) {
      std::fprintf(stderr, "\nkvtier: interrupted\n");
      return 130;
    }
    std::fprintf(stderr, "kvtier: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kvtier: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvtier: error: %s\n", e.what());
    return 1;
  }
}
