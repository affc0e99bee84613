#include "plan/offload_plan.h"

#include "config/config.h"

#include <algorithm>

namespace mmtrain {

std::string OffloadSetting::name() const {
  std::string out;
  auto add = [&out](const char* part) { out += (out.empty() ? "" : "+") + std::string(part); };
  if (activations) add("activations");
  if (cpu_offload) add(disk ? "cpu_offload(disk)" : "cpu_offload");
  if (swap) add(state_8bit ? "adamw8bit(disk)" : disk ? "adamw_swap(disk)" : "adamw_swap(host)");
  return out.empty() ? "none" : out;
}

OffloadSetting OffloadSetting::of(const Config& config) {
  OffloadSetting s;
  s.activations = config.features.enable_activation_offload;
  s.cpu_offload = config.parallel.fsdp_plan.cpu_offload;
  s.disk = !config.training.offload_dir.empty();
  s.state_8bit = config.training.optimizer == "adamw8bit";
  s.swap = config.training.optimizer == "adamw_swap" || (s.disk && (s.cpu_offload || s.state_8bit));
  return s;
}

std::vector<OffloadSetting> OffloadSetting::all() {
  return {{},
          {true, false, false, false},
          {false, true, false, false},
          {false, false, true, false},
          {false, false, true, true},
          {false, true, true, true},
          {true, true, true, true}};
}

std::vector<OffloadSetting> OffloadSetting::all_for(const std::string& optimizer) {
  std::vector<OffloadSetting> out = all();
  if (optimizer != "adamw8bit") return out;
  std::erase_if(out, [](const OffloadSetting& s) { return s.swap && !s.disk; });  // its state is on the host already
  for (auto& s : out) s.state_8bit = true;
  return out;
}

TierBytes offload_tier_bytes(const OffloadPlanInputs& in, const OffloadSetting& s) {
  const FsdpMemoryPlan& p = *in.fsdp;
  TierBytes t;
  t.device = p.sharded_state_bytes() + p.transient_bytes() + in.other_device_bytes + in.activation_bytes;
  if (s.activations && in.num_layers > 0) {
    const int64_t per_layer = in.layers_kept_bytes / in.num_layers;
    t.device -= per_layer * std::max<int64_t>(0, in.num_layers - 2);
    t.host += per_layer * std::max<int64_t>(0, in.num_layers - 1);
  }
  if (s.cpu_offload) {
    t.device -= p.sharded_state_bytes();
    t.host += p.sharded_state_bytes();
    // The reduced grads wait on the device for their copy to the host: one shard-sized buffer
    // per reduction in flight and the one being issued (without offload they reduce in place).
    t.device += (kFsdpReductionsInFlight + 1) * p.largest_shard_numel() *
                static_cast<int64_t>(c10::elementSize(p.config.reduce_dtype));
  }
  int64_t& beside_shards = s.cpu_offload ? t.host : t.device;
  if (in.ema_offload == "host") {
    t.host += in.ema_bytes;
    beside_shards += in.ema_window_bytes;
  } else if (in.ema_offload == "disk") {
    t.disk += in.ema_bytes;
    t.host += in.ema_window_bytes;
  } else {
    beside_shards += in.ema_bytes;
  }
  // The moments leave the side where the step runs (the host under cpu_offload); three windows
  // take their place there, or in host RAM when the disk holds them.
  int64_t& step_side = s.cpu_offload ? t.host : t.device;
  if (s.swap) step_side -= p.optimizer_bytes;
  if (s.swap && s.disk) {
    t.disk += p.optimizer_bytes;
    t.host += in.window_bytes;
    if (s.cpu_offload) {  // the trained shards too, but for the unit in use and the one read ahead
      const int64_t paged = p.param_bytes - p.frozen_param_bytes;  // frozen ones stay in the host tier
      t.host -= paged;
      t.disk += paged;
      t.host += 2 * p.largest_shard_numel() * static_cast<int64_t>(sizeof(float));
    }
  } else if (s.swap) {
    t.host += p.optimizer_bytes;
    step_side += in.window_bytes;
  }
  return t;
}

PhaseBytes offload_phase_bytes(const FsdpMemoryPlan& plan, const OffloadSetting& s, bool device_is_host,
                               bool saves_frozen) {
  const int64_t unit = plan.largest_shard_numel() * static_cast<int64_t>(sizeof(float));
  const bool moments_on_disk = s.swap && s.disk;
  // Tensors a save writes from the device: the shards without cpu_offload, in-memory moments.
  const bool on_device = !device_is_host && (!s.cpu_offload || !s.swap);
  PhaseBytes b;
  // The step holds two shards from the disk already (the one in use, the one read ahead): start-up,
  // a save and a resume page theirs through the same two.
  b.startup.host = plan.largest_param_numel * static_cast<int64_t>(sizeof(float));
  b.save.host = (moments_on_disk ? unit : 0) + (on_device ? unit : 0);
  b.async_save.host = plan.param_bytes - (saves_frozen ? 0 : plan.frozen_param_bytes) + plan.optimizer_bytes;
  (s.cpu_offload ? b.resume.host : b.resume.device) += 2 * unit;
  b.resume.host += unit + (moments_on_disk ? unit : 0);
  return b;
}

std::vector<Phase> config_phases(const PhaseBytes& phases, const Config& config) {
  const auto& t = config.training;
  std::vector<Phase> out = {{"start-up", phases.startup}};
  if (!t.save.empty()) out.push_back({"a checkpoint save", t.async_save ? phases.async_save : phases.save});
  if (!t.load.empty()) out.push_back({"the resume", phases.resume});
  if (t.eval_interval > 0 || t.eval_at_start) out.push_back({"an evaluation", phases.evaluation});
  if (t.sample_interval > 0 || t.sample_at_start) out.push_back({"a sampling phase", phases.sampling});
  if (t.objective == "grpo") out.push_back({"the GRPO rollout", phases.rollout});
  return out;
}

PhasePeak largest_phase(const std::vector<Phase>& phases, const std::function<int64_t(const TierBytes&)>& bytes_of) {
  PhasePeak peak{phases.at(0).name, bytes_of(phases.at(0).bytes)};
  for (const auto& phase : phases)
    if (bytes_of(phase.bytes) > peak.bytes) peak = {phase.name, bytes_of(phase.bytes)};
  return peak;
}

}  // namespace mmtrain
