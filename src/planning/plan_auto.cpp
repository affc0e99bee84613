#include "planning/plan_auto.h"

#include "core/checked_math.h"
#include "core/error.h"
#include "core/text.h"
#include "io/user_file.h"
#include "nn/sequence_split.h"
#include "parallel/context_parallel.h"
#include "plan/device_profile.h"
#include "plan/length_mix.h"
#include "plan/offload_plan.h"
#include "plan/plan_estimate.h"
#include "plan/step_time.h"
#include "train/build.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace mmtrain {
namespace {

constexpr double kGB = 1e9;

struct Candidate {
  std::vector<std::string> sets;  // the --set overrides that make it
  std::string summary;            // one line for people
  TierBytes bytes;                // per rank: the step plus the largest phase around it
  StepTime time;
};

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

std::string yaml_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

// The step's bytes plus, per tier, the largest phase this config has beside it (as the pre-flight
// counts it).
TierBytes with_phases(const TierBytes& step, const PhaseBytes& phases, const Config& cfg) {
  const auto around = config_phases(phases, cfg);
  TierBytes out = step;
  out.device += largest_phase(around, [](const TierBytes& b) { return b.device; }).bytes;
  out.host += largest_phase(around, [](const TierBytes& b) { return b.host; }).bytes;
  out.disk += largest_phase(around, [](const TierBytes& b) { return b.disk; }).bytes;
  return out;
}

// The component that takes the most of a predicted step.
std::string largest_component(const StepTime& t) {
  const std::pair<const char*, double> parts[] = {
      {"GEMMs", t.gemm_ms},          {"attention", t.attention_ms},       {"recompute", t.recompute_ms},
      {"FSDP", t.fsdp_exposed_ms},   {"Ulysses", t.ulysses_ms},           {"ring", t.ring_exposed_ms},
      {"host copies", t.host_exposed_ms}, {"disk", t.disk_exposed_ms},    {"optimizer", t.optimizer_ms}};
  return std::max_element(std::begin(parts), std::end(parts),
                          [](const auto& a, const auto& b) { return a.second < b.second; })->first;
}

}  // namespace

void plan_auto(const PlanOptions& o) {
  if (o.device.empty()) fail("plan --auto: needs --device (a profile to time the candidates on)");
  if (o.nodes < 1 || o.devices_per_node < 1) fail("plan --auto: needs --nodes and --devices-per-node");
  if (o.top < 1) fail("plan --auto: --top must be >= 1, found ", o.top);
  const int world = o.nodes * o.devices_per_node, per_node = o.devices_per_node;
  const DeviceProfile profile = load_device_profile(o.device);
  const double device_budget = o.device_memory_gb > 0 ? o.device_memory_gb * kGB : 0.9 * profile.memory_gb * kGB;
  const double host_budget = (o.host_memory_gb > 0 ? o.host_memory_gb : 0.9 * profile.host_memory_gb * per_node) * kGB;
  const double disk_budget = o.disk_gb > 0 ? o.disk_gb * kGB : std::numeric_limits<double>::infinity();
  const auto images = plan_images(o);

  const Config base = config_load(o.config_path, o.overrides);
  const ModelSpec& spec = model_spec(base.model.model_id, "config " + base.source_path + ": model.model_id");
  if (!spec.flops) fail("plan --auto: model '", spec.name, "' has no FLOPs formula to time candidates with");
  auto model = build_model(base);  // LoRA's adapters and frozen base included
  // The sequence lengths: --seqlen, else the data set's own (its longest sizes the memory, all of
  // them time the step), else the model's default.
  int64_t seqlen = checked_tokens(o.seqlen, "plan --auto: --seqlen");
  LengthMix mix;
  if (seqlen == 0) {
    mix = read_length_mix(base);
    seqlen = mix.longest();
  }
  // The global batch stays what the config gives on this world.
  const int64_t global_batch = config_global_batch(base, config_check_world(base, world));
  const auto& recompute_modules = base.features.recompute_plan.apply_modules;
  const bool can_estimate = static_cast<bool>(spec.activations);
  // Context parallelism only for a model that splits its sequence, at Ulysses degrees its
  // attention heads divide (what parallelize checks when the run starts).
  auto* splits = dynamic_cast<SplitsSequence*>(model.get());
  auto cp_runs = [&](int ulysses, int ring) {
    if (ulysses * ring == 1) return true;
    if (!splits || !can_estimate) return false;  // the estimate gives the attention widths CP needs
    try {
      check_ulysses_heads(splits->attention_heads(), ulysses);
    } catch (const Error&) {
      return false;
    }
    return true;
  };

  std::vector<OffloadSetting> settings;
  for (const auto& s : OffloadSetting::all_for(base.training.optimizer)) {
    if (s.disk && base.training.offload_dir.empty()) continue;  // no directory to put it in
    if (s.activations && recompute_modules.empty()) continue;   // no blocks to offload from
    // adamw8bit's update runs on host shards: on a device a run without cpu_offload is refused.
    if (base.training.optimizer == "adamw8bit" && !s.cpu_offload) continue;
    settings.push_back(s);
  }
  std::vector<bool> recomputes = {false};
  if (!recompute_modules.empty()) recomputes.push_back(true);

  std::vector<Candidate> fitting;
  int64_t tried = 0, refused = 0, over_device = 0, over_host = 0, over_disk = 0;
  TierBytes least{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(),
                  std::numeric_limits<int64_t>::max()};
  for (int ulysses : divisors(world))
    for (int ring : divisors(world / ulysses)) {
      const int cp = ulysses * ring;
      if (!cp_runs(ulysses, ring)) continue;
      for (int shard : divisors(world / cp)) {
        const int fsdp = shard * cp, dp = world / cp;
        // A token budget sizes the micro-batches itself (micro_batch_size stays 1).
        const int64_t max_micro = base.data.loader.micro_batch_tokens > 0 ? 1 : global_batch / dp;
        for (int64_t micro = 1; micro <= max_micro; micro *= 2) {
          if (global_batch % (micro * dp) != 0) continue;
          for (bool recompute : recomputes)
            for (const auto& s : settings) {
              ++tried;
              Candidate c;
              c.sets = {"parallel.data_parallel_size=auto",
                        "parallel.fully_shard_parallel_size=" + std::to_string(fsdp),
                        "parallel.ulysses_parallel_size=" + std::to_string(ulysses),
                        "parallel.ring_attention_size=" + std::to_string(ring),
                        std::string("features.recompute=") + (recompute ? "true" : "false"),
                        std::string("features.enable_activation_offload=") + (s.activations ? "true" : "false"),
                        std::string("parallel.fsdp_plan.cpu_offload=") + (s.cpu_offload ? "true" : "false"),
                        "training.optimizer=" + (base.training.optimizer == "adamw8bit" ? std::string("adamw8bit")
                                                 : s.swap ? std::string("adamw_swap") : std::string("adamw")),
                        "training.micro_batch_size=" + std::to_string(micro),
                        "training.gradient_accumulation_steps=0",
                        "training.global_batch_size=" + std::to_string(global_batch)};
              if (s.activations) c.sets.push_back("features.activation_offload_plan.apply_modules=" + yaml_list(recompute_modules));
              if (!s.disk) c.sets.push_back("training.offload_dir=''");
              auto sets = o.overrides;
              sets.insert(sets.end(), c.sets.begin(), c.sets.end());
              std::unique_ptr<PlanEstimate> e;
              try {
                const Config cfg = config_load(o.config_path, sets);
                config_check_supported(cfg, world);  // what `train` would refuse
                e = plan_estimate(cfg, world, seqlen, *model, images, mix.seqlens);
              } catch (const Error&) {
                ++refused;  // a combination the config checks refuse (e.g. heads the degree does not divide)
                continue;
              }
              const PhaseBytes phases = e->phase_bytes(s, /*device_is_host=*/false);
              c.bytes = with_phases(offload_tier_bytes(e->offload_inputs(), s), phases, e->cfg);
              least.device = std::min(least.device, c.bytes.device);
              least.host = std::min(least.host, c.bytes.host * per_node);
              least.disk = std::min(least.disk, c.bytes.disk * per_node);
              if (c.bytes.device > device_budget) { ++over_device; continue; }
              if (c.bytes.host * per_node > host_budget) { ++over_host; continue; }
              if (c.bytes.disk * per_node > disk_budget) { ++over_disk; continue; }
              bool flops = false;
              c.time = predict_step_time(e->step_inputs(per_node, &flops), profile, e->plan.config.param_dtype);
              c.summary = format("fsdp %d x replicas %d, ulysses %d, ring %d, recompute %s, offload %s, micro %lld x accum %d",
                                 fsdp, world / fsdp, ulysses, ring, recompute ? "on" : "off", s.name().c_str(),
                                 static_cast<long long>(micro), config_accumulation(e->cfg, e->dims));
              fitting.push_back(std::move(c));
            }
        }
      }
    }
  std::printf("mmtrain plan --auto: %s on %d x %d %s, global batch %lld, %s\n", base.source_path.c_str(), o.nodes,
              per_node, profile.name.c_str(), static_cast<long long>(global_batch),
              can_estimate ? "activations estimated" : "activations not estimated (memory is a lower bound)");
  if (o.seqlen > 0)
    std::printf("  sequence length: %lld tokens (--seqlen)\n", static_cast<long long>(o.seqlen));
  else if (!mix.seqlens.empty())
    std::printf("  sequence lengths from the data set: %zu of its %lld samples read, median %g, longest %lld tokens "
                "(memory for the longest, step time over all)\n",
                mix.seqlens.size(), static_cast<long long>(mix.dataset_size), mix.median(),
                static_cast<long long>(mix.longest()));
  else
    std::printf("  sequence length: the model's default (%s)\n", mix.unavailable.c_str());
  std::printf("  budgets per rank: device %.1f GB; per node: host %s, disk %s\n", device_budget / kGB,
              format("%.1f GB", host_budget / kGB).c_str(),
              std::isinf(disk_budget) ? "no limit" : format("%.1f GB", disk_budget / kGB).c_str());
  std::printf("  %lld candidates: %lld refused by the config checks, %lld over the device budget, %lld over host, "
              "%lld over disk, %zu fit\n",
              static_cast<long long>(tried), static_cast<long long>(refused), static_cast<long long>(over_device),
              static_cast<long long>(over_host), static_cast<long long>(over_disk), fitting.size());
  if (fitting.empty())
    fail("plan --auto: nothing fits: the smallest candidate needs ", format("%.1f", least.device / kGB),
         " GB of device memory per rank (budget ", format("%.1f", device_budget / kGB), "), ",
         format("%.1f", least.host / kGB), " GB of host memory per node (budget ", format("%.1f", host_budget / kGB), "), ",
         format("%.1f", least.disk / kGB), " GB of disk per node (budget ",
         std::isinf(disk_budget) ? std::string("no limit") : format("%.1f", disk_budget / kGB),
         "); add devices or nodes, or allow training.offload_dir");
  std::stable_sort(fitting.begin(), fitting.end(),
                   [](const Candidate& a, const Candidate& b) { return a.time.total_ms < b.time.total_ms; });
  nlohmann::ordered_json best = nlohmann::ordered_json::array();
  for (size_t i = 0; i < fitting.size() && i < static_cast<size_t>(o.top); ++i) {
    const auto& c = fitting[i];
    std::printf("  %zu. %9.4g ms  %s\n       device %.3g / host %.3g / disk %.3g GB per rank; largest part: %s\n", i + 1,
                c.time.total_ms, c.summary.c_str(), c.bytes.device / kGB, c.bytes.host / kGB, c.bytes.disk / kGB,
                largest_component(c.time).c_str());
    auto entry = step_time_json(c.time);
    best.push_back({{"summary", c.summary},
                    {"sets", c.sets},
                    {"device_bytes", c.bytes.device},
                    {"host_bytes", c.bytes.host},
                    {"disk_bytes", c.bytes.disk},
                    {"step_time", entry}});
  }
  if (!o.out.empty()) {
    if (std::filesystem::exists(std::filesystem::symlink_status(o.out)))
      fail("plan --auto: ", o.out, " exists (remove it first)");
    std::string text = "# mmtrain plan --auto's choice for " + base.source_path + " on " + std::to_string(o.nodes) +
                       " x " + std::to_string(per_node) + " " + profile.name + ": " + fitting[0].summary + "\n";
    for (const auto& set : fitting[0].sets) text += set + "\n";
    write_file_no_follow(o.out, text, "plan --auto --out");
    std::printf("  wrote the winner's settings to %s (mmtrain train %s --set-file %s)\n", o.out.c_str(),
                base.source_path.c_str(), o.out.c_str());
  }
  const nlohmann::ordered_json j = {{"tried", tried},         {"refused", refused},         {"over_device", over_device},
                                    {"over_host", over_host}, {"over_disk", over_disk},     {"fitting", fitting.size()},
                                    {"device_budget_bytes", device_budget}, {"seqlen", seqlen},
                                    {"seqlens_read", mix.seqlens.size()}, {"best", best}};
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace mmtrain
