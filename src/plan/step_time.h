// The step-time model beside the memory plan: what one optimizer step costs one rank, by
// component, from the models' FLOPs formulas, the FSDP memory plan's bytes and a device profile
// (plan/device_profile.h). `mmtrain plan --device` prints it; docs/step_time.md derives each rule
// and checks one case by hand. Per rank and step, with S the rank's fp32 shard elements, W the
// FSDP group, R its HSDP replicas, T the tokens of a micro-batch on this rank:
//   compute    t_gemm = F_gemm / (peak x e_gemm), t_attn = F_attn / (peak x e_attn); F = FLOPs per
//              sample (forward + backward) x samples per data-parallel rank / cp (CP splits the
//              tokens); peak of the gathered params' dtype (bf16, or fp32)
//   recompute  one more forward: F_gemm / 3 and 2/7 of F_attn (forward 2 of the seed's 7)
//   fsdp       per micro-batch: the forward all-gather, (W-1)/W of every unit gathered; the
//              backward re-gather of the non-root units (reshard_after_forward); the
//              reduce-scatter, (W-1)/W of the full grads in reduce_dtype; with HSDP the grads'
//              all-reduce, 2 (R-1)/R of the shard grads. At link x e_comm, the link intra- or
//              inter-node by where the group's ranks are. Exposed: what exceeds overlap x compute,
//              plus the root unit's gather, which nothing runs before
//   ulysses    per layer, 4 all-to-alls of (U-1)/U x e x T x (2 q + 2 kv) bytes in forward, twice
//              that in backward, once more under recompute: on the critical path
//   ring       per layer, R_cp - 1 steps of the k/v block (2 e T_r kv) in forward, and of the block
//              and the fp32 dK/dV (2 e T_r kv + 8 T_r kv) in backward: exposed beyond overlap x
//              the attention time
//   offload    host link: cpu_offload's shards to the device (fp32, each gather) and grads back
//              (each micro-batch), activation offload's layer inputs out and back: exposed beyond
//              overlap x compute; adamw_swap's moments in and out (16 S) and the disk tier's
//              moments (8 S read, 8 S written) and shards (4 S each way at the update) stream
//              beside the update, which takes the longer of the two; shards on disk are also read
//              for each gather (read ahead: exposed beyond overlap x compute)
//   dequantize a quantized base (features.lora.base_quant): after each gather of a unit, a memory-
//              bound pass over its quantized rows and the weights it writes in the gather dtype;
//              the fsdp gathers move those rows, not the weights
//   optimizer  a memory-bound pass of 28 bytes per element (p, g, m, v read; p, m, v written) at
//              device memory bandwidth (host memory under cpu_offload)
// A forward-only pass (StepTimeInputs::forward_only) keeps the forward's share of each rule.
#pragma once
#include "fsdp/plan.h"
#include "parallel/parallel_dims.h"
#include "plan/device_profile.h"
#include "plan/offload_plan.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

struct StepTimeInputs {
  const FsdpMemoryPlan* fsdp = nullptr;
  ParallelDims dims;
  int devices_per_node = 1;
  int64_t micro_batch_size = 1;      // samples per micro-batch
  int64_t accumulation = 1;          // micro-batches per step on each data-parallel rank
  double gemm_flops_per_sample = 0;       // forward + backward, the models' FLOPs formulas
  double attention_flops_per_sample = 0;  // the quadratic term of the same
  bool recompute = false;
  OffloadSetting offload;
  // Of the model's activation estimate (0 when it has none: Ulysses, ring and activation offload
  // are then not modeled, and notes say so).
  int64_t tokens_per_rank = 0;       // T: a micro-batch's tokens on this rank
  int64_t q_width = 0, kv_width = 0, num_layers = 0;
  int64_t offloaded_activation_bytes = 0;  // per micro-batch, to the host and back (activation offload)
  // One forward under no-grad (a sampler's; plan/sampling_plan.h) instead of a step: the FLOPs are
  // the forward's, one micro-batch; no backward, reduction, recompute or update. Its GEMMs run no
  // faster than reading the gathered weights at memory bandwidth once (a decode step's bound).
  bool forward_only = false;
};

struct StepTime {
  double gemm_ms = 0, attention_ms = 0, recompute_ms = 0;  // compute
  double fsdp_ms = 0, fsdp_exposed_ms = 0;                 // all-gathers, reduce-scatters, HSDP all-reduce
  double ulysses_ms = 0, ring_ms = 0, ring_exposed_ms = 0;
  double host_link_ms = 0, host_exposed_ms = 0;            // copies that overlap compute
  double disk_ms = 0, disk_exposed_ms = 0;                 // shard reads ahead of the gathers
  double optimizer_ms = 0;  // the update, or the traffic streaming beside it when that is longer
  double dequantize_ms = 0; // a quantized base's weights dequantized after each gather
  double total_ms = 0;
  std::vector<std::string> notes;  // what the model could not count
  double compute_ms() const { return gemm_ms + attention_ms + recompute_ms; }
};

// Fails naming the input when a count is not positive.
StepTime predict_step_time(const StepTimeInputs& in, const DeviceProfile& profile, at::ScalarType compute_dtype);
// Every component in milliseconds ("total_ms", "gemm_ms", ...), for plan's JSON.
nlohmann::ordered_json step_time_json(const StepTime& t);

}  // namespace mmtrain
