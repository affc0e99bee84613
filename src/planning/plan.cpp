#include "planning/plan.h"

#include "cli/command.h"
#include "cli/options.h"
#include "config/config.h"
#include "core/checked_math.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/text.h"
#include "fsdp/plan.h"
#include "models/model_spec.h"
#include "optim/swapped_state.h"
#include "plan/device_profile.h"
#include "plan/offload_plan.h"
#include "plan/plan_estimate.h"
#include "plan/sampling_plan.h"
#include "plan/step_time.h"
#include "planning/plan_auto.h"
#include "planning/plan_calibrate.h"
#include "train/build.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <tuple>

namespace mmtrain {
namespace {

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

void row(const std::string& label, int64_t bytes) {
  std::printf("  %-62s %9.3f GiB %17s B\n", label.c_str(), gib(bytes), with_commas(bytes).c_str());
}

// The step time for this config on the profile's devices (plan/step_time.h), printed as a
// breakdown and added to the JSON.
std::optional<double> print_step_time(const PlanOptions& o, const PlanEstimate& e, int devices_per_node,
                                      nlohmann::ordered_json& j) {
  const DeviceProfile profile = load_device_profile(o.device);
  bool flops = false;
  const StepTimeInputs in = e.step_inputs(devices_per_node, &flops);
  if (!flops) {
    std::printf("\n  step time: %s\n", !e.spec->flops ? ("no FLOPs formula for model '" + e.spec->name + "'").c_str()
                                                        : "pass --seqlen to predict it");
    return std::nullopt;
  }
  const StepTime t = predict_step_time(in, profile, e.plan.config.param_dtype);
  std::printf("\n  step time on %d x %s (%s), %d per node, per rank: %.1f ms\n", e.dims.world, profile.name.c_str(),
              profile.description.c_str(), devices_per_node, t.total_ms);
  auto line = [](const char* what, double value_ms, const std::string& how) {
    std::printf("    %-28s %10.1f ms  %s\n", what, value_ms, how.c_str());
  };
  line("GEMMs", t.gemm_ms, format("efficiency %.2f", profile.gemm_efficiency));
  line("attention", t.attention_ms, format("efficiency %.2f", profile.attention_efficiency));
  line("recompute", t.recompute_ms, e.recompute ? "one more forward" : "off");
  line("FSDP collectives, exposed", t.fsdp_exposed_ms, format("of %.1f ms; overlap %.2f", t.fsdp_ms, profile.overlap));
  line("Ulysses all-to-all", t.ulysses_ms, e.dims.ulysses > 1 ? "on the critical path" : "none");
  line("ring P2P, exposed", t.ring_exposed_ms, format("of %.1f ms", t.ring_ms));
  line("host copies, exposed", t.host_exposed_ms, format("of %.1f ms", t.host_link_ms));
  line("disk reads, exposed", t.disk_exposed_ms, format("of %.1f ms", t.disk_ms));
  if (t.dequantize_ms > 0) line("dequantize the base", t.dequantize_ms, "after each gather (features.lora.base_quant)");
  line("optimizer step", t.optimizer_ms, in.offload.swap || in.offload.cpu_offload ? "with its offload traffic" : "memory-bound");
  for (const auto& note : t.notes) std::printf("    (%s)\n", note.c_str());
  j["step_time"] = step_time_json(t);
  j["step_time"]["device"] = profile.name;
  j["step_time"]["devices_per_node"] = devices_per_node;
  return t.total_ms;
}

// The sampling phase (plan/sampling_plan.h): its forwards, their memory and, with --device, its
// time against the step's.
void print_sampling(const PlanOptions& o, const PlanEstimate& e, int devices_per_node, std::optional<double> step_ms,
                    nlohmann::ordered_json& j) {
  const std::optional<DeviceProfile> profile =
      o.device.empty() ? std::nullopt : std::optional<DeviceProfile>(load_device_profile(o.device));
  for (const auto& [s, title, key] :
       {std::tuple{plan_sampling(e, profile ? &*profile : nullptr, devices_per_node),
                   "sampling phase (training.sample_prompts)", "sampling"},
        std::tuple{plan_rollout(e, profile ? &*profile : nullptr, devices_per_node), "GRPO rollout, every step", "rollout"}}) {
    if (!s) continue;
    std::printf("\n  %s, per rank: %s\n", title, s->work.summary.c_str());
    row("the largest forward (no-grad) + what the generator holds", s->forward_bytes);
    if (!e.no_activations.empty()) std::printf("    (activations not counted: %s)\n", e.no_activations.c_str());
    j[key] = {{"forwards", s->forwards}, {"forward_bytes", s->forward_bytes},
              {"held_device_bytes", s->work.held_device_bytes}, {"beyond_step_device_bytes", s->beyond_step.device}};
    if (s->time_ms) {
      std::printf("    %-28s %10.1f s%s\n", "time", *s->time_ms / 1e3,
                  step_ms && *step_ms > 0 ? format(" = %.1f training steps", *s->time_ms / *step_ms).c_str() : "");
      j[key]["time_ms"] = *s->time_ms;
    }
  }
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> plan_images(const PlanOptions& o) {
  std::vector<std::pair<int64_t, int64_t>> images;
  for (const auto& text : o.images) {
    long long h = 0, w = 0;
    char end = 0;
    if (std::sscanf(text.c_str(), "%lld,%lld%c", &h, &w, &end) != 2 || h < 1 || w < 1)
      fail("plan: --image '", text, "': expected H,W in pixels, both >= 1 (e.g. --image 1024,768)");
    images.emplace_back(h, w);
  }
  return images;
}

void plan_memory(const PlanOptions& o) {
  if (o.world_size < 1) fail("plan: --world-size must be >= 1, found ", o.world_size);
  checked_tokens(o.seqlen, "plan: --seqlen");
  int world = o.world_size, devices_per_node = o.devices_per_node;
  if (o.nodes > 0 || o.devices_per_node > 0) {
    if (o.nodes < 1 || o.devices_per_node < 1)
      fail("plan: --nodes and --devices-per-node go together, found ", o.nodes, " and ", o.devices_per_node);
    if (o.world_size != 1 && o.world_size != o.nodes * o.devices_per_node)
      fail("plan: --world-size ", o.world_size, " is not --nodes x --devices-per-node = ", o.nodes * o.devices_per_node);
    world = o.nodes * o.devices_per_node;
  }
  if (devices_per_node == 0) devices_per_node = world;  // one node
  const auto loaded = config_load(o.config_path, o.overrides);
  model_spec(loaded.model.model_id, "config " + loaded.source_path + ": model.model_id");  // a named error first
  auto model = build_model(loaded);  // LoRA's adapters and frozen base included
  const auto estimate = plan_estimate(loaded, world, o.seqlen, *model, plan_images(o));
  const PlanEstimate& e = *estimate;
  const Config& cfg = e.cfg;
  const ParallelDims& dims = e.dims;
  const int fsdp_size = dims.fsdp();
  const auto& fp = cfg.parallel.fsdp_plan;
  const auto& id = cfg.model.model_id;
  const FsdpMemoryPlan& plan = e.plan;
  const bool recompute = e.recompute;
  const int64_t seqlen = e.seqlen, micro = e.micro;
  const int ring = dims.ring, ulysses = dims.ulysses, cp = dims.cp();
  const ActivationEstimate& act = e.act;
  const std::string& no_activations = e.no_activations;
  const int64_t cp_buffer_bytes = e.cp_buffer_bytes;

  const auto& root = plan.units[0];
  const UnitPlan* largest = &root;
  for (const auto& unit : plan.units)
    if (unit.numel > largest->numel) largest = &unit;
  const std::string p_name = dtype_name(fp.param_dtype), r_name = dtype_name(fp.reduce_dtype);

  std::printf("mmtrain plan: %s on %d rank(s), FSDP shard group %d\n", cfg.source_path.c_str(), world, fsdp_size);
  std::printf("  mesh: dp_replicate %d x dp_shard %d x ring %d x ulysses %d (data-parallel %d, context-parallel %d)\n",
              world / fsdp_size, fsdp_size / cp, ring, ulysses, world / cp, cp);
  std::printf("  parameters from model '%s' (its Module tree)\n", id.c_str());
  std::printf("  %s params in %zu units: root %s, largest '%s' %s; param_dtype %s, reduce_dtype %s, "
              "prefetch fwd %d / bwd %d\n",
              with_commas(plan.total_numel).c_str(), plan.units.size(), with_commas(root.numel).c_str(),
              largest->name.c_str(), with_commas(largest->numel).c_str(), p_name.c_str(), r_name.c_str(),
              fp.num_to_forward_prefetch, fp.num_to_backward_prefetch);
  if (plan.trained_numel != plan.total_numel)
    std::printf("  %s of them train (%.2f %%): the rest is frozen, its shards in %s, with no grads or moments\n",
                with_commas(plan.trained_numel).c_str(), 100.0 * static_cast<double>(plan.trained_numel) / plan.total_numel,
                p_name.c_str());
  std::printf("\n  per rank\n");
  const std::string& base_quant = cfg.features.lora.base_quant;
  const std::string frozen_form = cfg.features.enable_lora && base_quant != "none" ? base_quant + " / " + p_name : p_name;
  row(plan.trained_numel != plan.total_numel ? "param shards (fp32 trained, " + frozen_form + " frozen)" : "fp32 param shards",
      plan.param_bytes);
  row("fp32 grad shards", plan.grad_bytes);
  row(cfg.training.optimizer == "adamw8bit"
          ? "AdamW8bit exp_avg + exp_avg_sq (uint8 codes, fp32 absmax per 256)"
          : "AdamW exp_avg + exp_avg_sq (fp32)",
      plan.optimizer_bytes);
  row("= sharded state", plan.sharded_state_bytes());
  row("root unit, gathered all step (" + p_name + ")", plan.root_gathered_bytes);
  row(std::to_string(plan.units_in_flight) + " units in flight (" + p_name + ", from '" + plan.in_flight_first + "')",
      plan.in_flight_bytes);
  row("backward: unit grads (" + p_name + ") + " + std::to_string(kFsdpReductionsInFlight + 1) +
          " reduce-scatter bufs (" + r_name + ")",
      plan.reduce_bytes);

  nlohmann::ordered_json j = {{"config", cfg.source_path},
                              {"model_id", id},
                              {"world_size", world},
                              {"fsdp_size", fsdp_size},
                              {"param_dtype", p_name},
                              {"reduce_dtype", r_name},
                              {"total_params", plan.total_numel},
                              {"trainable_params", plan.trained_numel},
                              {"units", plan.units.size()},
                              {"param_bytes", plan.param_bytes},
                              {"grad_bytes", plan.grad_bytes},
                              {"optimizer_bytes", plan.optimizer_bytes},
                              {"sharded_state_bytes", plan.sharded_state_bytes()},
                              {"unsharded_param_bytes", plan.unsharded_param_bytes},
                              {"root_gathered_bytes", plan.root_gathered_bytes},
                              {"units_in_flight", plan.units_in_flight},
                              {"in_flight_bytes", plan.in_flight_bytes},
                              {"reduce_bytes", plan.reduce_bytes},
                              {"recompute", recompute}};
  j["dp_replicate"] = world / fsdp_size;
  j["ring"] = ring;
  j["ulysses"] = ulysses;
  j["cp_size"] = cp;
  const std::string& reference_quant = cfg.training.dpo.reference_quant;
  if (e.reference_copy_bytes > 0)
    row("dpo reference: a frozen copy of the initial weights (" +
            (reference_quant != "none" ? reference_quant + " / " : std::string()) + p_name + ")",
        e.reference_copy_bytes);
  if (e.ema_bytes > 0)
    row(cfg.training.ema.offload == "none" ? std::string("EMA shadows (fp32, training.ema)")
                                           : "EMA shadows (fp32, training.ema; in the " + cfg.training.ema.offload + " tier)",
        e.ema_bytes);
  j["ema_bytes"] = e.ema_bytes;
  j["sequences_per_sample"] = e.sequences_per_sample;
  j["reference_copy_bytes"] = e.reference_copy_bytes;
  const int64_t fixed =
      plan.sharded_state_bytes() + plan.transient_bytes() + cp_buffer_bytes + e.reference_copy_bytes + e.ema_bytes;
  if (no_activations.empty()) {
    const std::string sequences_note =
        cfg.training.objective == "dpo"    ? ": dpo pairs, two sequences each"
        : cfg.training.objective == "grpo" ? format(": grpo prompts, each as %lld completions of up to %lld tokens after it",
                                                    static_cast<long long>(e.sequences_per_sample),
                                                    static_cast<long long>(e.completion_tokens))
                                           : "";
    if (cfg.data.loader.micro_batch_tokens > 0)  // plan_estimate sizes one packed micro-batch of the budget
      std::printf("\n  activations, %lld token(s) per %s (data.dataloader_param.micro_batch_tokens %lld), %lld layers\n",
                  static_cast<long long>(act.tokens), cp == 1 ? "micro-batch" : "rank",
                  static_cast<long long>(cfg.data.loader.micro_batch_tokens), static_cast<long long>(act.num_layers));
    else if (cp == 1)
      std::printf("\n  activations, %lld token(s) per micro-batch (%lld x %lld%s), %lld layers\n",
                  static_cast<long long>(act.tokens), static_cast<long long>(micro * e.sequences_per_sample),
                  static_cast<long long>(seqlen + e.completion_tokens), sequences_note.c_str(),
                  static_cast<long long>(act.num_layers));
    else
      std::printf("\n  activations, %lld token(s) per rank (%lld x %lld over %d context-parallel ranks%s), %lld layers\n",
                  static_cast<long long>(act.tokens), static_cast<long long>(micro * e.sequences_per_sample),
                  static_cast<long long>(seqlen + e.completion_tokens), cp, sequences_note.c_str(),
                  static_cast<long long>(act.num_layers));
    row("recompute on: layer inputs (all layers)", act.layer_inputs_bytes);
    row("recompute on: one layer rebuilt (" + act.largest_layer + ")", act.max_layer_full_bytes);
    row("outside the layers (batch, embeddings, heads, loss)", act.outside_bytes);
    row("backward working set of one layer", act.backward_bytes);
    row("= activations, recompute on", act.with_recompute_bytes());
    row("= activations, recompute off (every layer saved)", act.without_recompute_bytes());
    std::printf("\n  saved by %s:\n", act.largest_layer.c_str());
    for (const auto& [name, bytes] : act.layer_tensors) row("  " + name, bytes);
    std::printf("\n");
    if (cp > 1) row("context-parallel buffers of one layer's attention", cp_buffer_bytes);
    row(std::string("= TOTAL per rank, recompute on") + (recompute ? "  (this config)" : ""),
        fixed + act.with_recompute_bytes());
    row(std::string("= TOTAL per rank, recompute off") + (recompute ? "" : "  (this config)"),
        fixed + act.without_recompute_bytes());
    j["seqlen"] = seqlen;
    j["micro_batch_size"] = micro;
    j["tokens"] = act.tokens;
    j["cp_buffer_bytes"] = cp_buffer_bytes;
    j["activation_layer_inputs_bytes"] = act.layer_inputs_bytes;
    j["activation_max_layer_bytes"] = act.max_layer_full_bytes;
    j["activation_outside_bytes"] = act.outside_bytes;
    j["activation_backward_bytes"] = act.backward_bytes;
    j["activation_bytes_recompute"] = act.with_recompute_bytes();
    j["activation_bytes_no_recompute"] = act.without_recompute_bytes();
    j["total_bytes_recompute"] = fixed + act.with_recompute_bytes();
    j["total_bytes_no_recompute"] = fixed + act.without_recompute_bytes();
    j["total_bytes"] = fixed + (recompute ? act.with_recompute_bytes() : act.without_recompute_bytes());
  } else {
    std::printf("\n  activations: %s\n", no_activations.c_str());
    row("= TOTAL per rank without activations", fixed);
    j["total_bytes_without_activations"] = fixed;
  }
  // The offload features, each and combined (plan/offload_plan.h has the rules).
  const OffloadPlanInputs offload_in = e.offload_inputs();
  const OffloadSetting chosen = OffloadSetting::of(cfg);
  std::printf("\n  offload features, per rank: device / host tier / disk%s\n",
              no_activations.empty() ? "" : " (activations not counted)");
  j["offload"] = nlohmann::ordered_json::object();
  for (const auto& setting : OffloadSetting::all_for(cfg.training.optimizer)) {
    const TierBytes t = offload_tier_bytes(offload_in, setting);
    std::printf("    %-48s %9.3f / %9.3f / %9.3f GiB%s\n", setting.name().c_str(), gib(t.device), gib(t.host),
                gib(t.disk), setting == chosen ? "  (this config)" : "");
    j["offload"][setting.name()] = {{"device_bytes", t.device}, {"host_bytes", t.host}, {"disk_bytes", t.disk}};
  }
  // Around the step, for this config's setting: what start-up, a checkpoint save and a resume hold
  // beyond it (plan/offload_plan.h), on a GPU; the pre-flight adds the largest to the step.
  const PhaseBytes phases = e.phase_bytes(chosen, /*device_is_host=*/false);
  std::printf("\n  around the step (%s), per rank, beyond it: device / host tier / disk\n", chosen.name().c_str());
  j["phases"] = nlohmann::ordered_json::object();
  for (const auto& [name, key, t] : {std::tuple<const char*, const char*, TierBytes>{"start-up", "startup", phases.startup},
                                     {"checkpoint save", "save", phases.save},
                                     {"checkpoint save, training.async_save", "async_save", phases.async_save},
                                     {"resume (training.load)", "resume", phases.resume},
                                     {"evaluation (training.eval_interval)", "evaluation", phases.evaluation},
                                     {"sampling (training.sample_interval)", "sampling", phases.sampling},
                                     {"GRPO rollout (training.objective grpo)", "rollout", phases.rollout}}) {
    std::printf("    %-48s %9.3f / %9.3f / %9.3f GiB\n", name, gib(t.device), gib(t.host), gib(t.disk));
    j["phases"][key] = {{"device_bytes", t.device}, {"host_bytes", t.host}, {"disk_bytes", t.disk}};
  }
  j["offload_window_bytes"] = offload_in.window_bytes;
  j["largest_shard_numel"] = plan.largest_shard_numel();
  j["largest_param_numel"] = plan.largest_param_numel;
  std::optional<double> step_ms;
  if (!o.device.empty()) step_ms = print_step_time(o, e, devices_per_node, j);
  print_sampling(o, e, devices_per_node, step_ms, j);
  std::printf("  (on CPU the device is the host: device + host share its RAM, and a save copies nothing to it)\n");
  std::printf("  (no allocator reserve, comm library buffers, kernel workspaces or runtime context: "
              "docs/tools.md)\n");
  std::printf("%s\n", j.dump().c_str());
}

void add_plan_commands(CLI::App& app, Commands& commands) {
  auto o = std::make_shared<PlanOptions>();
  auto* plan = app.add_subcommand("plan", "per-rank memory of a run, from shapes only (docs/tools.md)");
  plan->add_option("config", o->config_path, "YAML config file (not with --calibrate)");
  plan->add_option("--world-size,--world_size", o->world_size, "ranks")->capture_default_str();
  plan->add_option("--seqlen", o->seqlen, "tokens per sample (default: the model's)");
  plan->add_option("--image", o->images,
                   "H,W in pixels of one image of a sample, as the processor sizes it (repeatable; a vision "
                   "tower's activations and FLOPs; --seqlen holds their tokens)");
  auto overrides = std::make_shared<ConfigOverrides>();
  overrides->add_options(plan, "parallel.fsdp_plan.cpu_offload=true");
  plan->add_option("--device", o->device,
                   "device profile for the step time: h200, h100, a100, 910b3, or a profile JSON (docs/step_time.md)");
  plan->add_option("--nodes", o->nodes, "nodes (with --devices-per-node: the world)");
  plan->add_option("--devices-per-node,--devices_per_node", o->devices_per_node,
                   "devices per node (default: the whole world on one node)");
  plan->add_flag("--auto", o->auto_search,
                 "search the parallel, recompute, offload and micro-batch settings (needs --device, --nodes, "
                 "--devices-per-node; docs/step_time.md)");
  plan->add_option("--device-memory-gb", o->device_memory_gb, "--auto: device budget per rank (default 0.9 x the profile's)");
  plan->add_option("--host-memory-gb", o->host_memory_gb, "--auto: host memory budget per node (default 0.9 x the profile's)");
  plan->add_option("--disk-gb", o->disk_gb, "--auto: offload disk budget per node (default no limit)");
  plan->add_option("--top", o->top, "--auto: candidates to print")->capture_default_str();
  plan->add_option("--out", o->out,
                   "--auto: write the winner's settings here (train --set-file takes it); --calibrate: the profile");
  auto calibrate = std::make_shared<CalibrateOptions>();
  plan->add_option("--calibrate", calibrate->runs,
                   "fit --device's efficiencies to these run directories (their plan.json and metrics) and write "
                   "the profile to --out (docs/step_time.md)")
      ->expected(1, -1);
  plan->add_option("--skip-first", calibrate->skip_first, "--calibrate: warm-up iterations of each run left out")
      ->capture_default_str();
  commands.add(plan, [o, calibrate, overrides] {
    if (!calibrate->runs.empty()) {
      if (!o->config_path.empty()) fail("plan --calibrate takes run directories, not a CONFIG ('", o->config_path, "')");
      calibrate->device = o->device;
      calibrate->out = o->out;
      return plan_calibrate(*calibrate);
    }
    if (o->config_path.empty()) fail("plan: a CONFIG is required");
    o->overrides = overrides->resolved();
    if (o->auto_search) return plan_auto(*o);
    plan_memory(*o);
  });
}

}  // namespace mmtrain
