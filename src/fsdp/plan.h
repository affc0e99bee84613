// FSDP units and per-rank memory, computed from names and shapes alone: nothing is allocated, so
// a 15B model on 8 ranks is planned in milliseconds on a laptop. fsdp_assign_units is the one rule
// Fsdp (fully_shard.cpp) builds its units with, so the plan's shard sizes are exactly what
// Fsdp::memory_stats reports for the same model, world size and apply_modules.
//
// Per rank (all fp32 unless stated; S_u = Σ padded shard numel of unit u's trained params, F_u
// of its frozen ones (Param::requires_grad false: LoRA's base), torch.chunk rule):
//   params     4 · Σ_u S_u + Σ_u F_u · p_u   fp32 master shards (Fsdp::shard_flat), frozen ones in
//                                            their gather dtype (Fsdp::frozen_flat); a quantized
//                                            frozen weight (Param::base_quant) its padded rows of
//                                            codes and scales instead (Fsdp::quant_flat)
//   grads      4 · Σ_u S_u            fp32 reduced grads (Fsdp::grad_flat)
//   optimizer  8 · Σ_u S_u            AdamW exp_avg + exp_avg_sq
//   root       W · (S + F)_root · p   the root unit, gathered for the whole step (p = param_dtype size;
//                                     LoRA adapters in their adapter_dtype)
//   in flight  max over k consecutive non-root units of Σ W · (S + F)_u · p, k = 1 + max(forward,
//              backward prefetch): the running unit plus the ones prefetched behind it, each
//              gathered [W·(S + F)_u] (all units when reshard_after_forward is off); a quantized
//              weight adds the buffer its bytes are gathered into (let go once dequantized)
//   reduce     backward of one unit: its trained params' unsharded grads (numel · p) plus, for the
//              kFsdpReductionsInFlight + 1 largest units (in flight + the one being issued), 2W · S_u
//              in reduce_dtype: the grads held until sent (or their staged copy) [W·S_u], the
//              output [S_u] and Gloo's receive buffer [(W-1)·S_u] (Comm::reduce_scatter_sum_blocks)
// Activations are model-specific: models/activation_estimate.h.
#pragma once
#include "fsdp/fsdp_config.h"
#include "fsdp/shard_layout.h"
#include "quant/base_quant.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

class Module;

// Reduce-scatters Fsdp keeps in flight while the next unit's backward runs.
constexpr int kFsdpReductionsInFlight = 1;

// Which unit every parameter belongs to. units[0] is the root (""), then every module (other
// than the root) matching an apply_modules pattern, in module order. A parameter belongs to the
// deepest unit whose module name is a dotted prefix of its name, else to the root. Fails when a
// pattern matches no module (the message names the pattern).
struct UnitAssignment {
  std::vector<std::string> units;
  std::vector<size_t> owner;  // per parameter, in the order given: index into units
};
UnitAssignment fsdp_assign_units(const std::vector<std::string>& module_names,
                                 const std::vector<std::string>& param_names,
                                 const std::vector<std::string>& apply_modules);

struct PlanParam {
  std::string name;             // full dotted name
  std::vector<int64_t> shape;   // full (unsharded) shape
  bool compute_in_fp32 = false; // Param::compute_in_fp32
  bool frozen = false;          // !Param::requires_grad: no grad, no moments, kept in its gather dtype
  std::optional<at::ScalarType> adapter_dtype;  // Param::adapter_dtype: gathered in it, outside the unit's agreement
  quant::BaseQuant quant = quant::BaseQuant::none;  // Param::base_quant: stored and gathered as rows of bytes
};

// The dtype a unit's params are gathered in: fp32 when every one computes in fp32
// (Param::compute_in_fp32), else param_dtype. A unit that mixes both is an error naming one of
// each: the unit's coalesced all-gather has one dtype. params: (name, compute_in_fp32).
at::ScalarType unit_gather_dtype(const std::string& unit_name, const std::vector<std::pair<std::string, bool>>& params,
                                 at::ScalarType param_dtype);

struct UnitPlan {
  std::string name;               // "" for the root
  int64_t num_params = 0;
  int64_t numel = 0;              // full elements
  int64_t trained_numel = 0;      // full elements of the params that take grads
  int64_t shard_numel = 0;        // S: padded elements of trained params every rank stores (fp32)
  int64_t frozen_shard_numel = 0; // F: padded elements of frozen params every rank stores (gather dtype)
  int64_t gathered_numel = 0;     // W · (S + F): the gather buffers (the full params are their prefix)
  int64_t gathered_bytes = 0;     // those buffers, each param in the dtype it computes in
  int64_t numel_bytes = 0;        // the full params in the dtypes they compute in
  int64_t gather_bytes = 0;       // what its all-gather moves in all: numel_bytes, a quantized weight's rows of bytes instead
  int64_t quantized_numel = 0;    // full elements of its quantized weights, dequantized after each gather
  int64_t quantized_bytes = 0;    // their rows of bytes (part of gather_bytes)
  at::ScalarType gather_dtype = at::kFloat;  // unit_gather_dtype (adapters excepted)
};

struct FsdpMemoryPlan {
  FsdpConfig config;
  int world_size = 1;             // ranks in the FSDP shard group
  std::vector<UnitPlan> units;    // units[0] is the root
  int64_t total_numel = 0;        // full model elements
  int64_t trained_numel = 0;      // of them, the ones that take grads (all but a LoRA run's base)
  int64_t largest_param_numel = 0;  // full elements of the largest parameter
  int64_t param_bytes = 0;        // per rank, as Fsdp::memory_stats().param_bytes
  int64_t frozen_param_bytes = 0; // of them, the frozen shards (in their gather dtype; never on the disk tier)
  int64_t grad_bytes = 0;         // as Fsdp::memory_stats().grad_bytes
  int64_t optimizer_bytes = 0;    // as AdamW::state_bytes()
  int64_t unsharded_param_bytes = 0;  // every unit gathered, as memory_stats().unsharded_param_bytes
  int64_t root_gathered_bytes = 0;
  int64_t units_in_flight = 0;        // k
  int64_t in_flight_bytes = 0;        // the largest window of k consecutive non-root units
  std::string in_flight_first;        // first unit of that window
  int64_t reduce_bytes = 0;
  int64_t sharded_state_bytes() const { return param_bytes + grad_bytes + optimizer_bytes; }
  int64_t largest_shard_numel() const;  // of the units' flat shards (AdamW's params)
  int64_t transient_bytes() const { return root_gathered_bytes + in_flight_bytes + reduce_bytes; }
};

// The plan for parameters params (named_parameters order) of a model whose modules are
// module_names (named_modules order, the root "" may be included), under the FSDP config the
// engine would get, over world_size shard ranks.
FsdpMemoryPlan fsdp_memory_plan(const std::vector<PlanParam>& params, const std::vector<std::string>& module_names,
                                const FsdpConfig& config, int world_size);
// Same for a built model; also fails, as Fsdp does, when a selected module is not a block.
FsdpMemoryPlan fsdp_memory_plan(Module& model, const FsdpConfig& config, int world_size);

// The module names a parameter table implies: every dotted prefix of every name, first
// appearance first ("" first), i.e. the pre-order of the tree the names describe.
std::vector<std::string> module_names_from_params(const std::vector<PlanParam>& params);

}  // namespace mmtrain
