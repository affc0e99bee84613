#include "tools/plan.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/text.h"
#include "fsdp/plan.h"
#include "models/model_spec.h"
#include "optim/swapped_moments.h"
#include "train/device_profile.h"
#include "train/step_time.h"
#include "train/offload_plan.h"
#include "tools/command.h"
#include "train/config.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <tuple>

namespace mmtrain {
namespace {

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

void row(const std::string& label, int64_t bytes) {
  std::printf("  %-62s %9.3f GiB %17s B\n", label.c_str(), gib(bytes), with_commas(bytes).c_str());
}

// The step time for this config on the profile's devices (train/step_time.h), printed as a
// breakdown and added to the JSON.
void print_step_time(const PlanOptions& o, const Config& cfg, const ParallelDims& dims, const FsdpMemoryPlan& plan,
                     const ModelSpec& spec, int64_t seqlen, const ActivationEstimate& act, bool recompute,
                     int devices_per_node, nlohmann::ordered_json& j) {
  const DeviceProfile profile = load_device_profile(o.device);
  StepTimeInputs in;
  in.fsdp = &plan;
  in.dims = dims;
  in.devices_per_node = devices_per_node;
  in.micro_batch_size = cfg.training.micro_batch_size;
  in.accumulation = config_accumulation(cfg, dims);
  in.recompute = recompute;
  in.offload = OffloadSetting::of(cfg);
  if (!spec.flops || seqlen == 0) {
    std::printf("\n  step time: %s\n", !spec.flops ? ("no FLOPs formula for model '" + spec.name + "'").c_str()
                                                      : "pass --seqlen to predict it");
    return;
  }
  FlopsQuery query;
  query.seqlens = {seqlen};
  const FlopsReport flops = spec.flops(cfg.model.config, query);
  in.attention_flops_per_sample = flops.attention_flops_per_sample;
  in.gemm_flops_per_sample = flops.flops_per_sample - flops.attention_flops_per_sample;
  if (act.num_layers > 0) {
    in.tokens_per_rank = act.tokens;
    in.q_width = act.q_width;
    in.kv_width = act.kv_width;
    in.num_layers = act.num_layers;
    // Activation offload sends n - 1 of the n layers' kept tensors (train/offload_plan.h).
    const int64_t kept = recompute ? act.layer_inputs_bytes : act.layers_full_bytes;
    in.offloaded_activation_bytes = kept / act.num_layers * std::max<int64_t>(0, act.num_layers - 1);
  }
  const StepTime t = predict_step_time(in, profile, plan.config.param_dtype);
  std::printf("\n  step time on %d x %s (%s), %d per node, per rank: %.1f ms\n", dims.world, profile.name.c_str(),
              profile.description.c_str(), devices_per_node, t.total_ms);
  auto line = [](const char* what, double value_ms, const std::string& how) {
    std::printf("    %-28s %10.1f ms  %s\n", what, value_ms, how.c_str());
  };
  line("GEMMs", t.gemm_ms, format("efficiency %.2f", profile.gemm_efficiency));
  line("attention", t.attention_ms, format("efficiency %.2f", profile.attention_efficiency));
  line("recompute", t.recompute_ms, recompute ? "one more forward" : "off");
  line("FSDP collectives, exposed", t.fsdp_exposed_ms, format("of %.1f ms; overlap %.2f", t.fsdp_ms, profile.overlap));
  line("Ulysses all-to-all", t.ulysses_ms, dims.ulysses > 1 ? "on the critical path" : "none");
  line("ring P2P, exposed", t.ring_exposed_ms, format("of %.1f ms", t.ring_ms));
  line("host copies, exposed", t.host_exposed_ms, format("of %.1f ms", t.host_link_ms));
  line("disk reads, exposed", t.disk_exposed_ms, format("of %.1f ms", t.disk_ms));
  line("optimizer step", t.optimizer_ms, in.offload.swap || in.offload.cpu_offload ? "with its offload traffic" : "memory-bound");
  for (const auto& note : t.notes) std::printf("    (%s)\n", note.c_str());
  j["step_time"] = {{"device", profile.name},       {"devices_per_node", devices_per_node},
                    {"total_ms", t.total_ms},       {"gemm_ms", t.gemm_ms},
                    {"attention_ms", t.attention_ms}, {"recompute_ms", t.recompute_ms},
                    {"fsdp_ms", t.fsdp_ms},         {"fsdp_exposed_ms", t.fsdp_exposed_ms},
                    {"ulysses_ms", t.ulysses_ms},   {"ring_ms", t.ring_ms},
                    {"ring_exposed_ms", t.ring_exposed_ms}, {"host_link_ms", t.host_link_ms},
                    {"host_exposed_ms", t.host_exposed_ms}, {"disk_ms", t.disk_ms},
                    {"disk_exposed_ms", t.disk_exposed_ms}, {"optimizer_ms", t.optimizer_ms}};
}

}  // namespace

void plan_memory(const PlanOptions& o) {
  if (o.world_size < 1) fail("plan: --world-size must be >= 1, found ", o.world_size);
  if (o.seqlen < 0) fail("plan: --seqlen must be >= 0, found ", o.seqlen);
  int world = o.world_size, devices_per_node = o.devices_per_node;
  if (o.nodes > 0 || o.devices_per_node > 0) {
    if (o.nodes < 1 || o.devices_per_node < 1)
      fail("plan: --nodes and --devices-per-node go together, found ", o.nodes, " and ", o.devices_per_node);
    if (o.world_size != 1 && o.world_size != o.nodes * o.devices_per_node)
      fail("plan: --world-size ", o.world_size, " is not --nodes x --devices-per-node = ", o.nodes * o.devices_per_node);
    world = o.nodes * o.devices_per_node;
  }
  if (devices_per_node == 0) devices_per_node = world;  // one node
  const auto cfg = config_load(o.config_path, o.overrides);
  const ParallelDims dims = config_check_world(cfg, world);
  const int fsdp_size = dims.fsdp();
  const auto& fp = cfg.parallel.fsdp_plan;
  const auto& id = cfg.model.model_id;
  const auto& spec = model_spec(id, "config " + cfg.source_path + ": model.model_id");
  auto model = spec.build(cfg.model.config);
  const FsdpMemoryPlan plan = fsdp_memory_plan(*model, fp, fsdp_size);

  const bool recompute = cfg.features.recompute && !cfg.features.recompute_plan.apply_modules.empty();
  const int64_t seqlen = o.seqlen > 0 ? o.seqlen : spec.default_seqlen;
  const int64_t micro = cfg.training.micro_batch_size;
  // Context parallelism splits a micro-batch's packed tokens over the CP ranks (padded to a
  // multiple of the degree): the activations are those of the local tokens.
  const int ring = dims.ring, ulysses = dims.ulysses, cp = dims.cp();
  const int64_t tokens_per_rank = (micro * seqlen + cp - 1) / cp;
  ActivationEstimate act;
  std::string no_activations;
  if (!spec.activations)
    no_activations = "no activation estimator for model '" + id + "'";
  else if (seqlen == 0)
    no_activations = "pass --seqlen to estimate activations";
  else if (cp == 1)
    act = spec.activations(ActivationQuery{cfg.model.config, seqlen, micro, fp.param_dtype});
  else
    act = spec.activations(ActivationQuery{cfg.model.config, tokens_per_rank, 1, fp.param_dtype});
  // The context-parallel buffers of one layer's attention (e = param_dtype bytes, T the local
  // tokens, T_r = U * T the ring chunk, q/kv widths per Ulysses rank):
  //   Ulysses: send + receive buffers of the q, k, v and output all-to-alls, 2 e T (2 q + 2 kv)
  //   ring forward: the k/v block held and the one arriving, 2 x 2 e T_r kv, and the fp32
  //     output accumulator 4 T_r q; backward: the same k/v pair, the fp32 dK/dV travelling
  //     (held and arriving, 2 x 2 x 4 T_r kv) and the fp32 dQ (4 T_r q): the larger of the two.
  int64_t cp_buffer_bytes = 0;
  if (cp > 1 && no_activations.empty()) {
    const int64_t e = static_cast<int64_t>(c10::elementSize(fp.param_dtype)), t = tokens_per_rank;
    if (ulysses > 1) cp_buffer_bytes += 2 * e * t * (2 * act.q_width + 2 * act.kv_width);
    if (ring > 1) {
      const int64_t tr = ulysses * t, q = act.q_width / ulysses, kv = std::max<int64_t>(act.kv_width / ulysses, 1);
      const int64_t forward = 2 * 2 * e * tr * kv + 4 * tr * q;
      const int64_t backward = 2 * 2 * e * tr * kv + 2 * 2 * 4 * tr * kv + 4 * tr * q;
      cp_buffer_bytes += std::max(forward, backward);
    }
  }

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
  std::printf("\n  per rank\n");
  row("fp32 param shards", plan.param_bytes);
  row("fp32 grad shards", plan.grad_bytes);
  row("AdamW exp_avg + exp_avg_sq (fp32)", plan.optimizer_bytes);
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
  const int64_t fixed = plan.sharded_state_bytes() + plan.transient_bytes() + cp_buffer_bytes;
  if (no_activations.empty()) {
    if (cp == 1)
      std::printf("\n  activations, %lld token(s) per micro-batch (%lld x %lld), %lld layers\n",
                  static_cast<long long>(act.tokens), static_cast<long long>(micro), static_cast<long long>(seqlen),
                  static_cast<long long>(act.num_layers));
    else
      std::printf("\n  activations, %lld token(s) per rank (%lld x %lld over %d context-parallel ranks), %lld layers\n",
                  static_cast<long long>(act.tokens), static_cast<long long>(micro), static_cast<long long>(seqlen), cp,
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
  // The offload features, each and combined (train/offload_plan.h has the rules). The windows are
  // those of the largest chunk; at run time training.mem_fraction_static of the free memory may
  // make them smaller.
  OffloadPlanInputs offload_in;
  offload_in.fsdp = &plan;
  offload_in.other_device_bytes = cp_buffer_bytes;
  if (no_activations.empty()) {
    offload_in.activation_bytes = recompute ? act.with_recompute_bytes() : act.without_recompute_bytes();
    offload_in.layers_kept_bytes = recompute ? act.layer_inputs_bytes : act.layers_full_bytes;
    offload_in.num_layers = act.num_layers;
  }
  offload_in.window_bytes =
      SwappedMoments::window_bytes_for(SwappedMoments::chunk_numel_for(1.0, std::nullopt, plan.largest_shard_numel()));
  const OffloadSetting chosen = OffloadSetting::of(cfg);
  std::printf("\n  offload features, per rank: device / host tier / disk%s\n",
              no_activations.empty() ? "" : " (activations not counted)");
  j["offload"] = nlohmann::ordered_json::object();
  for (const auto& setting : OffloadSetting::all()) {
    const TierBytes t = offload_tier_bytes(offload_in, setting);
    std::printf("    %-48s %9.3f / %9.3f / %9.3f GiB%s\n", setting.name().c_str(), gib(t.device), gib(t.host),
                gib(t.disk), setting == chosen ? "  (this config)" : "");
    j["offload"][setting.name()] = {{"device_bytes", t.device}, {"host_bytes", t.host}, {"disk_bytes", t.disk}};
  }
  // Around the step, for this config's setting: what start-up, a checkpoint save and a resume hold
  // beyond it (train/offload_plan.h), on a GPU; the pre-flight adds the largest to the step.
  const PhaseBytes phases = offload_phase_bytes(plan, chosen, /*device_is_host=*/false);
  std::printf("\n  around the step (%s), per rank, beyond it: device / host tier / disk\n", chosen.name().c_str());
  j["phases"] = nlohmann::ordered_json::object();
  for (const auto& [name, key, t] : {std::tuple<const char*, const char*, TierBytes>{"start-up", "startup", phases.startup},
                                     {"checkpoint save", "save", phases.save},
                                     {"checkpoint save, training.async_save", "async_save", phases.async_save},
                                     {"resume (training.load)", "resume", phases.resume}}) {
    std::printf("    %-48s %9.3f / %9.3f / %9.3f GiB\n", name, gib(t.device), gib(t.host), gib(t.disk));
    j["phases"][key] = {{"device_bytes", t.device}, {"host_bytes", t.host}, {"disk_bytes", t.disk}};
  }
  j["offload_window_bytes"] = offload_in.window_bytes;
  j["largest_shard_numel"] = plan.largest_shard_numel();
  j["largest_param_numel"] = plan.largest_param_numel;
  if (!o.device.empty()) print_step_time(o, cfg, dims, plan, spec, seqlen, act, recompute, devices_per_node, j);
  std::printf("  (on CPU the device is the host: device + host share its RAM, and a save copies nothing to it)\n");
  std::printf("  (no allocator reserve, comm library buffers, kernel workspaces or runtime context: "
              "docs/tools.md)\n");
  std::printf("%s\n", j.dump().c_str());
}

void add_plan_commands(CLI::App& app, Commands& commands) {
  auto o = std::make_shared<PlanOptions>();
  auto* plan = app.add_subcommand("plan", "per-rank memory of a run, from shapes only (docs/tools.md)");
  plan->add_option("config", o->config_path, "YAML config file")->required();
  plan->add_option("--world-size,--world_size", o->world_size, "ranks")->capture_default_str();
  plan->add_option("--seqlen", o->seqlen, "tokens per sample (default: the model's)");
  plan->add_option("--set", o->overrides, "override a config key (repeatable)");
  plan->add_option("--device", o->device,
                   "device profile for the step time: h200, h100, a100, 910b3, or a profile JSON (docs/step_time.md)");
  plan->add_option("--nodes", o->nodes, "nodes (with --devices-per-node: the world)");
  plan->add_option("--devices-per-node,--devices_per_node", o->devices_per_node,
                   "devices per node (default: the whole world on one node)");
  commands.add(plan, [o] { plan_memory(*o); });
}

}  // namespace mmtrain
