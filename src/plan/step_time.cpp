#include "plan/step_time.h"

#include "core/error.h"

#include <c10/core/ScalarType.h>

#include <algorithm>

namespace mmtrain {
namespace {

constexpr double kGB = 1e9;

// Milliseconds to move `bytes` at `gb_per_s`.
double ms(double bytes, double gb_per_s) { return bytes / (gb_per_s * kGB) * 1e3; }

// Collective bandwidth of a group of `size` ranks spaced `stride` apart: within a node when the
// span fits one (ranks fill nodes in order).
double group_gb_per_s(int size, int stride, const StepTimeInputs& in, const DeviceProfile& p) {
  const bool one_node = static_cast<int64_t>(size) * stride <= in.devices_per_node;
  return (one_node ? p.intra_node_gb_per_s : p.inter_node_gb_per_s) * p.comm_efficiency;
}

double element_size(at::ScalarType dtype) { return static_cast<double>(c10::elementSize(dtype)); }

}  // namespace

StepTime predict_step_time(const StepTimeInputs& in, const DeviceProfile& p, at::ScalarType compute_dtype) {
  if (!in.fsdp) fail("predict_step_time: no FSDP memory plan");
  if (in.devices_per_node < 1) fail("predict_step_time: devices per node must be >= 1, found ", in.devices_per_node);
  if (in.micro_batch_size < 1 || in.accumulation < 1)
    fail("predict_step_time: micro-batch size and accumulation must be >= 1, found ", in.micro_batch_size, " and ",
         in.accumulation);
  const FsdpMemoryPlan& plan = *in.fsdp;
  const ParallelDims& d = in.dims;
  const double accum = static_cast<double>(in.accumulation);
  StepTime t;

  // Compute: the rank's share of its data-parallel rank's samples.
  const double samples = static_cast<double>(in.micro_batch_size) * accum / d.cp();
  const double peak = (compute_dtype == at::kFloat ? p.peak_fp32_tflops : p.peak_bf16_tflops) * 1e12;
  t.gemm_ms = in.gemm_flops_per_sample * samples / (peak * p.gemm_efficiency) * 1e3;
  t.attention_ms = in.attention_flops_per_sample * samples / (peak * p.attention_efficiency) * 1e3;
  const bool backward = !in.forward_only;
  if (in.forward_only)
    t.gemm_ms = std::max(t.gemm_ms, ms(static_cast<double>(in.fsdp->unsharded_param_bytes), p.memory_gb_per_s));
  if (in.recompute && backward) t.recompute_ms = t.gemm_ms / 3.0 + t.attention_ms * 2.0 / 7.0;
  const double compute = t.compute_ms();
  const double hideable = p.overlap * compute;

  // FSDP, per micro-batch.
  const int W = d.fsdp(), R = d.dp_replicate;
  const double share = (W - 1.0) / W;
  double gathered = 0, root_gathered = 0;  // every unit in its gather dtype
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const double bytes = static_cast<double>(plan.units[u].gather_bytes);  // a quantized weight moves its bytes
    gathered += bytes;
    if (u == 0) root_gathered = bytes;
  }
  const double shard_elements = static_cast<double>(plan.grad_bytes) / 4.0;  // S: what reduces (LoRA: the adapters)
  const double reduce = element_size(plan.config.reduce_dtype);
  const double fsdp_link = group_gb_per_s(W, 1, in, p);
  double fsdp_bytes = share * gathered;                                              // forward gathers
  if (backward && plan.config.reshard_after_forward) fsdp_bytes += share * (gathered - root_gathered);  // backward's
  if (backward) fsdp_bytes += share * static_cast<double>(plan.trained_numel) * reduce;  // reduce-scatter
  t.fsdp_ms = accum * ms(fsdp_bytes, fsdp_link);
  if (R > 1 && backward) t.fsdp_ms += accum * ms(2.0 * (R - 1.0) / R * shard_elements * reduce, group_gb_per_s(R, W, in, p));
  const double first_gather_ms = accum * ms(share * root_gathered, fsdp_link);
  t.fsdp_exposed_ms = std::max(0.0, t.fsdp_ms - first_gather_ms - hideable) + first_gather_ms;

  // A quantized base: every gather of a unit dequantizes its weights, a memory-bound pass reading
  // their bytes and writing them in the gather dtype, on the compute stream (forward, and the
  // backward re-gather of the non-root units).
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const auto& unit = plan.units[u];
    if (unit.quantized_numel == 0) continue;
    const double pass = static_cast<double>(unit.quantized_bytes) +
                        static_cast<double>(unit.quantized_numel) * element_size(unit.gather_dtype);
    const double passes = 1.0 + (backward && plan.config.reshard_after_forward && u > 0 ? 1.0 : 0.0);
    t.dequantize_ms += accum * passes * ms(pass, p.memory_gb_per_s);
  }

  // Context parallelism, from the activation estimate's widths.
  const double e = element_size(compute_dtype), T = static_cast<double>(in.tokens_per_rank);
  const double layers = static_cast<double>(in.num_layers), forwards = in.recompute && backward ? 2.0 : 1.0;
  const bool widths = in.tokens_per_rank > 0 && in.q_width > 0 && in.kv_width > 0 && in.num_layers > 0;
  if (d.cp() > 1 && !widths) t.notes.push_back("context-parallel communication not modeled (no activation estimate)");
  if (d.ulysses > 1 && widths) {
    const double U = d.ulysses;
    const double forward = (U - 1.0) / U * e * T * (2.0 * in.q_width + 2.0 * in.kv_width);
    t.ulysses_ms = accum * layers * ms(forward * (forwards + (backward ? 2.0 : 0.0)), group_gb_per_s(d.ulysses, 1, in, p));
  }
  if (d.ring > 1 && widths) {
    const double Tr = d.ulysses * T, kv = std::max(1.0, static_cast<double>(in.kv_width) / d.ulysses);
    const double block = 2.0 * e * Tr * kv, dkv = 8.0 * Tr * kv;
    const double per_layer = (d.ring - 1.0) * (forwards * block + (backward ? block + dkv : 0.0));
    t.ring_ms = accum * layers * ms(per_layer, group_gb_per_s(d.ring, d.ulysses, in, p));
    const double attention_hides = p.overlap * (t.attention_ms + t.attention_ms * (in.recompute && backward ? 2.0 / 7.0 : 0.0));
    t.ring_exposed_ms = std::max(0.0, t.ring_ms - attention_hides);
  }

  // Offload traffic: copies beside compute, and what streams beside the update.
  const OffloadSetting& o = in.offload;
  double host_bytes = 0;
  const double gathers = backward && plan.config.reshard_after_forward ? 2.0 : 1.0;
  if (o.cpu_offload) {
    // Every shard comes over (trained fp32, frozen in their dtype: param_bytes); trained grads go back.
    host_bytes += accum * (gathers * static_cast<double>(plan.param_bytes) + (backward ? reduce * shard_elements : 0.0));
  }
  if (o.activations && backward) {
    if (in.offloaded_activation_bytes > 0)
      host_bytes += accum * 2.0 * static_cast<double>(in.offloaded_activation_bytes);
    else
      t.notes.push_back("activation offload's copies not modeled (no activation estimate)");
  }
  t.host_link_ms = ms(host_bytes, p.host_link_gb_per_s);
  double beside_update_ms = 0;  // the optimizer's traffic: it runs no faster than this
  if (o.swap && !o.disk && !o.cpu_offload) beside_update_ms += ms(16.0 * shard_elements, p.host_link_gb_per_s);
  if (o.swap && o.disk)
    beside_update_ms += ms(8.0 * shard_elements, p.disk_read_gb_per_s) + ms(8.0 * shard_elements, p.disk_write_gb_per_s);
  if (o.cpu_offload && o.disk) {
    beside_update_ms += ms(4.0 * shard_elements, p.disk_read_gb_per_s) + ms(4.0 * shard_elements, p.disk_write_gb_per_s);
    t.disk_ms = accum * ms(gathers * 4.0 * shard_elements, p.disk_read_gb_per_s);
  }
  // The copies and the disk reads share the compute that hides them with the gathers.
  const double left_to_hide = std::max(0.0, hideable - (t.fsdp_ms - first_gather_ms));
  t.host_exposed_ms = std::max(0.0, t.host_link_ms - left_to_hide);
  t.disk_exposed_ms = std::max(0.0, t.disk_ms - std::max(0.0, left_to_hide - t.host_link_ms));

  // The update: a memory-bound pass, or the traffic beside it.
  const double update_gb_per_s = o.cpu_offload ? p.host_memory_gb_per_s : p.memory_gb_per_s;
  if (backward) t.optimizer_ms = std::max(ms(28.0 * shard_elements, update_gb_per_s), beside_update_ms);

  t.total_ms = compute + t.dequantize_ms + t.fsdp_exposed_ms + t.ulysses_ms + t.ring_exposed_ms + t.host_exposed_ms + t.disk_exposed_ms +
               t.optimizer_ms;
  return t;
}

nlohmann::ordered_json step_time_json(const StepTime& t) {
  return {{"total_ms", t.total_ms},          {"gemm_ms", t.gemm_ms},
          {"attention_ms", t.attention_ms},  {"recompute_ms", t.recompute_ms},
          {"fsdp_ms", t.fsdp_ms},            {"fsdp_exposed_ms", t.fsdp_exposed_ms},
          {"ulysses_ms", t.ulysses_ms},      {"ring_ms", t.ring_ms},
          {"ring_exposed_ms", t.ring_exposed_ms}, {"host_link_ms", t.host_link_ms},
          {"host_exposed_ms", t.host_exposed_ms}, {"disk_ms", t.disk_ms},
          {"disk_exposed_ms", t.disk_exposed_ms}, {"optimizer_ms", t.optimizer_ms},
          {"dequantize_ms", t.dequantize_ms}};
}

}  // namespace mmtrain
