// kvtier profile -m MODEL [--json] [--kv-disk DIR] [-t N] [--isa ISA] [--link-gbps B]
//                [--profile-cache FILE] [--force | --no-cache] [--ctx S]
// Measures what KVPR's split-point scheduler needs on this machine (runtime/profiler.h): the home
// tier's link bandwidth (host DRAM, and a disk directory if given) and the model's K/V projection
// rate; caches the result in a small JSON file keyed by model and machine; prints the split the
// scheduler would choose at a context of S tokens.
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "policy/kvpr_schedule.h"
#include "run_common.h"
#include "runtime/model_files.h"
#include "runtime/profile_cache.h"

namespace kvtier::cli {
namespace {

struct ProfileArgs {
  std::string model;
  bool json = false;
  std::string kv_disk;
  int threads = 0;
  std::string isa;
  double link_gbps = 0;
  std::string cache;
  bool force = false;
  bool no_cache = false;
  int64_t ctx = 4096;
};

nlohmann::ordered_json split_json(const policy::KvprDecision& d, int64_t s_prime) {
  return {{"s_prime", s_prime},  {"l", d.l},
          {"t_s", d.at_l.total}, {"t_no_recompute_s", d.at_zero.total},
          {"x_s", d.at_l.x},     {"recompute_s", d.at_l.recompute},
          {"kv_s", d.at_l.kv}};
}

void print_link(const char* name, const runtime::LinkMeasurement& l) {
  fmt::print("  {:<22} {:8.3f} GB/s   ({} copies of {:.2f} MiB, median {:.3f} ms)\n", name,
             l.bytes_per_s / 1e9, l.copies, static_cast<double>(l.job_bytes) / (1 << 20), l.median_s * 1e3);
}

void print_split(const char* name, const policy::KvprDecision& d, int64_t s_prime) {
  fmt::print("  {:<22} l = {:5} of {}: {:.3f} ms per layer vs {:.3f} ms without recompute ({:+.1f} %)\n",
             name, d.l, s_prime, d.at_l.total * 1e3, d.at_zero.total * 1e3,
             d.at_zero.total > 0 ? (d.at_l.total / d.at_zero.total - 1) * 100 : 0.0);
}

int run_profile(const ProfileArgs& a) {
  runtime::ProfileOptions o;
  o.threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  o.isa = cli::isa_flag(a.isa).value_or(cpu::best_isa());
  o.disk_dir = a.kv_disk;
  o.link_bytes_per_s = a.link_gbps * 1e9;
  const std::string path = a.no_cache ? std::string() : profile_cache_path(a.cache);
  if (!a.no_cache && path.empty())
    fail(ErrorKind::kInvalidArgument,
         "no profile cache location: pass --profile-cache FILE, set KVTIER_PROFILE_CACHE or HOME, or use "
         "--no-cache");
  const auto model = runtime::load_model(a.model);
  runtime::CachedProfile cp;
  if (a.no_cache) {
    cp.profile = runtime::measure_profile(*model, o);
  } else {
    cp = runtime::get_profile(path, *model, o, a.force);
  }
  const runtime::Profile& p = cp.profile;
  const policy::KvprDecision host =
      policy::kvpr_decide(runtime::kvpr_costs(p, false), policy::KvprSchedule::kColumn, a.ctx, a.ctx);
  std::optional<policy::KvprDecision> disk;
  if (p.disk)
    disk = policy::kvpr_decide(runtime::kvpr_costs(p, true), policy::KvprSchedule::kColumn, a.ctx, a.ctx);

  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = a.model;
    j["cache_file"] = path;
    j["from_cache"] = cp.from_cache;
    j["profile"] = runtime::profile_json(p);
    j["split"] = {{"schedule", "column"}, {"host", split_json(host, a.ctx)}};
    if (disk) j["split"]["disk"] = split_json(*disk, a.ctx);
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  fmt::print("profile of {} (model hash {})\n", a.model, p.key.model_hash);
  fmt::print("  machine: {}, {} kernels, {} threads{}\n", p.key.cpu, p.key.isa, p.key.threads,
             p.key.link_bytes_per_s > 0
                 ? fmt::format(", link throttled to {:.3f} GB/s", p.key.link_bytes_per_s / 1e9)
                 : std::string());
  fmt::print("  {}\n", a.no_cache      ? std::string("measured (not cached)")
                       : cp.from_cache ? fmt::format("from the cache {} (--force re-measures)", path)
                                       : fmt::format("measured, stored in {}", path));
  print_link("host DRAM link:", p.host);
  if (p.disk) print_link(fmt::format("disk link ({}):", p.disk_io).c_str(), *p.disk);
  fmt::print("  {:<22} {:8.3f} GFLOP/s = {:.0f} tokens/s per layer ({} tokens per call)\n",
             "K/V projection:", p.proj_flops_per_s / 1e9, p.proj_tokens_per_s, p.proj_tokens);
  fmt::print("  {:<22} {:8.3f} ms for one token through every weight matrix\n",
             "decode weight pass:", p.decode_weights_s * 1e3);
  fmt::print("  {:<22} K,V {:.0f} B, activation row {:.0f} B, recompute {:.0f} FLOP\n",
             "per token and layer:", p.kv_bytes_per_token, p.x_bytes_per_token, p.proj_flops_per_token);
  fmt::print("KVPR split (column schedule, Eq. 10) at s' = {}:\n", a.ctx);
  print_split("over the host link:", host, a.ctx);
  if (disk) print_split("over the disk link:", *disk, a.ctx);
  return 0;
}

}  // namespace

void add_profile(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("profile",
                                 "measure the home tier's link bandwidth and the model's K/V projection rate "
                                 "(KVPR's profiler); cached per "
                                 "model and machine");
  auto a = std::make_shared<ProfileArgs>();
  cmd->add_option("-m,--model", a->model, "GGUF model file")->required();
  cmd->add_flag("--json", a->json, "print JSON");
  cmd->add_option("--kv-disk", a->kv_disk, "also profile a disk home tier in this directory");
  cmd->add_option("-t,--threads", a->threads, "worker threads of the projection (default: all cores)")
      ->check(non_negative());
  cmd->add_option("--isa", a->isa, "CPU kernel path (default: the best the CPU has)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  cmd->add_option(
         "--link-gbps", a->link_gbps,
         "measurement aid: throttle the transfer engine's loads to this many GB/s (10^9 bytes/s), to "
         "reproduce a slow link; not a feature of real runs")
      ->check(positive());
  cmd->add_option(
      "--profile-cache", a->cache,
      "profile cache file (default: $KVTIER_PROFILE_CACHE, else $XDG_CACHE_HOME/kvtier/profile.json, "
      "else ~/.cache/kvtier/profile.json)");
  auto* force = cmd->add_flag(
      "--force", a->force, "measure even if the cache has this profile (and replace a corrupt cache file)");
  cmd->add_flag("--no-cache", a->no_cache, "measure without reading or writing the cache")->excludes(force);
  cmd->add_option("--ctx", a->ctx, "context (cached tokens s') at which to show the scheduler's split")
      ->check(positive())
      ->capture_default_str();
  cmd->callback([&run, a] { run = [a] { return run_profile(*a); }; });
}

}  // namespace kvtier::cli
