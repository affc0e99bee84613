#include "fsdp/plan.h"

#include "core/error.h"
#include "core/module_pattern.h"
#include "nn/module.h"
#include "quant/quantized_rows.h"

#include <algorithm>
#include <set>

namespace mmtrain {
namespace {

bool module_owns(const std::string& module_name, const std::string& param_name) {
  return module_name.empty() || param_name.rfind(module_name + ".", 0) == 0;
}

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

UnitAssignment fsdp_assign_units(const std::vector<std::string>& module_names,
                                 const std::vector<std::string>& param_names,
                                 const std::vector<std::string>& apply_modules) {
  std::vector<ModulePattern> patterns;
  for (const auto& text : apply_modules) {
    if (modules_matching({text}, module_names).empty())
      fail("fsdp_plan.apply_modules: pattern '", text, "' matches no module of the model");
    patterns.emplace_back(text);
  }
  UnitAssignment out;
  out.units.push_back("");  // the root
  for (const auto& name : module_names) {
    if (name.empty()) continue;
    for (const auto& pattern : patterns)
      if (pattern.matches(name)) {
        out.units.push_back(name);
        break;
      }
  }
  // Deepest owner: the longest unit name that is a dotted prefix of the param name.
  out.owner.reserve(param_names.size());
  for (const auto& param : param_names) {
    size_t owner = 0, owner_depth = 0;
    for (size_t u = 1; u < out.units.size(); ++u) {
      if (!module_owns(out.units[u], param)) continue;
      if (out.units[u].size() + 1 > owner_depth) {
        owner = u;
        owner_depth = out.units[u].size() + 1;
      }
    }
    out.owner.push_back(owner);
  }
  return out;
}

at::ScalarType unit_gather_dtype(const std::string& unit_name, const std::vector<std::pair<std::string, bool>>& params,
                                 at::ScalarType param_dtype) {
  const std::pair<std::string, bool>* fp32 = nullptr;
  const std::pair<std::string, bool>* other = nullptr;
  for (const auto& p : params) (p.second ? fp32 : other) = &p;
  if (fp32 && other && param_dtype != at::kFloat)
    fail("FSDP unit '", unit_name.empty() ? "<root>" : unit_name, "' mixes '", fp32->first,
         "', which computes in fp32, with '", other->first, "', which computes in param_dtype: put them in different "
         "units (parallel.fsdp_plan.apply_modules)");
  return fp32 && !other ? at::kFloat : param_dtype;
}

std::vector<std::string> module_names_from_params(const std::vector<PlanParam>& params) {
  std::vector<std::string> names = {""};
  std::set<std::string> seen = {""};
  for (const auto& p : params)
    for (size_t dot = p.name.find('.'); dot != std::string::npos; dot = p.name.find('.', dot + 1)) {
      auto prefix = p.name.substr(0, dot);
      if (seen.insert(prefix).second) names.push_back(std::move(prefix));
    }
  return names;
}

int64_t FsdpMemoryPlan::largest_shard_numel() const {
  int64_t largest = 0;
  for (const auto& unit : units) largest = std::max(largest, unit.shard_numel);
  return largest;
}

FsdpMemoryPlan fsdp_memory_plan(const std::vector<PlanParam>& params, const std::vector<std::string>& module_names,
                                const FsdpConfig& config, int world) {
  if (world < 1) fail("memory plan: world size must be >= 1, found ", world);
  if (config.num_to_forward_prefetch < 0 || config.num_to_backward_prefetch < 0)
    fail("memory plan: prefetch counts must be >= 0, found ", config.num_to_forward_prefetch, " / ",
         config.num_to_backward_prefetch);
  std::vector<std::string> param_names;
  for (const auto& p : params) {
    if (p.shape.empty()) fail("parameter '", p.name, "' is 0-dim: FSDP shards dim 0");
    param_names.push_back(p.name);
  }
  const auto assignment = fsdp_assign_units(module_names, param_names, config.apply_modules);

  FsdpMemoryPlan plan;
  plan.config = config;
  plan.world_size = world;
  for (const auto& name : assignment.units) plan.units.push_back(UnitPlan{name});
  std::vector<std::vector<std::pair<std::string, bool>>> unit_params(plan.units.size());
  for (size_t i = 0; i < params.size(); ++i) {
    auto& unit = plan.units[assignment.owner[i]];
    const int64_t numel = elements(params[i].shape);
    unit.num_params += 1;
    unit.numel += numel;
    plan.largest_param_numel = std::max(plan.largest_param_numel, numel);
    if (!params[i].frozen) unit.trained_numel += numel;
    if (!params[i].adapter_dtype) unit_params[assignment.owner[i]].emplace_back(params[i].name, params[i].compute_in_fp32);
  }
  for (size_t u = 0; u < plan.units.size(); ++u)
    plan.units[u].gather_dtype = unit_gather_dtype(plan.units[u].name, unit_params[u], config.param_dtype);
  // Each param's shards and gather buffer, in the dtype it computes in.
  for (size_t i = 0; i < params.size(); ++i) {
    const ShardLayout layout(params[i].shape, world);
    auto& unit = plan.units[assignment.owner[i]];
    const int64_t p = static_cast<int64_t>(c10::elementSize(params[i].adapter_dtype.value_or(unit.gather_dtype)));
    (params[i].frozen ? unit.frozen_shard_numel : unit.shard_numel) += layout.shard_numel();
    unit.gathered_numel += layout.shard_numel() * world;
    unit.gathered_bytes += layout.shard_numel() * world * p;
    unit.numel_bytes += elements(params[i].shape) * p;
    if (params[i].quant != quant::BaseQuant::none) {
      const quant::QuantizedRowShape stored = quant::quantized_row_shape(params[i].quant, params[i].shape);
      const ShardLayout stored_layout({stored.rows, stored.width}, world);
      const int64_t row_bytes = quant::quantized_row_bytes(params[i].quant, stored.width);
      plan.frozen_param_bytes += stored_layout.padded_rows * row_bytes;
      unit.gathered_bytes += stored_layout.padded_rows * world * row_bytes;
      unit.gather_bytes += stored.rows * row_bytes;
      unit.quantized_bytes += stored.rows * row_bytes;
      unit.quantized_numel += elements(params[i].shape);
    } else {
      if (params[i].frozen) plan.frozen_param_bytes += layout.shard_numel() * p;
      unit.gather_bytes += elements(params[i].shape) * p;
    }
  }

  const int64_t r = static_cast<int64_t>(c10::elementSize(config.reduce_dtype));
  int64_t shard = 0;
  for (const auto& unit : plan.units) {
    plan.total_numel += unit.numel;
    plan.trained_numel += unit.trained_numel;
    shard += unit.shard_numel;
    plan.unsharded_param_bytes += unit.numel_bytes;
  }
  plan.param_bytes = 4 * shard + plan.frozen_param_bytes;
  plan.grad_bytes = 4 * shard;
  plan.optimizer_bytes = 8 * shard;
  plan.root_gathered_bytes = plan.units[0].gathered_bytes;

  // Gathered non-root units at once: the running one plus its prefetched neighbours, i.e. a
  // window of k consecutive units in forward order (backward walks the same order reversed).
  const size_t others = plan.units.size() - 1;
  const int64_t k = config.reshard_after_forward
                        ? 1 + std::max(config.num_to_forward_prefetch, config.num_to_backward_prefetch)
                        : static_cast<int64_t>(others);
  plan.units_in_flight = std::min<int64_t>(k, static_cast<int64_t>(others));
  for (size_t begin = 1; begin + plan.units_in_flight <= plan.units.size() && plan.units_in_flight > 0; ++begin) {
    int64_t bytes = 0;
    for (size_t u = begin; u < begin + plan.units_in_flight; ++u)
      bytes += plan.units[u].gathered_bytes;  // shards are cast into it directly
    if (bytes > plan.in_flight_bytes) {
      plan.in_flight_bytes = bytes;
      plan.in_flight_first = plan.units[begin].name;
    }
  }

  // Backward of one unit (post_backward): autograd's grads of its trained params (param_dtype),
  // and per reduction in flight or being issued its grads held until sent (or their staged copy
  // in reduce_dtype), its [S] output and Gloo's [(W-1) S] receive buffer.
  std::vector<int64_t> reduce_sizes;
  int64_t largest_grad_bytes = 0;
  for (const auto& unit : plan.units) {
    reduce_sizes.push_back(2 * world * unit.shard_numel * r);
    largest_grad_bytes = std::max(largest_grad_bytes, unit.trained_numel * static_cast<int64_t>(c10::elementSize(unit.gather_dtype)));
  }
  std::sort(reduce_sizes.rbegin(), reduce_sizes.rend());
  plan.reduce_bytes = largest_grad_bytes;
  const size_t reducing = kFsdpReductionsInFlight + 1;
  for (size_t i = 0; i < std::min(reducing, reduce_sizes.size()); ++i) plan.reduce_bytes += reduce_sizes[i];
  return plan;
}

FsdpMemoryPlan fsdp_memory_plan(Module& model, const FsdpConfig& config, int world_size) {
  std::vector<std::string> module_names;
  const auto modules = model.named_modules();
  for (const auto& [name, module] : modules) module_names.push_back(name);
  select_blocks(model, config.apply_modules, "fsdp_plan.apply_modules");  // as Fsdp: units are blocks
  std::vector<PlanParam> params;
  for (const auto& [name, param] : model.named_parameters())
    if (param->trainable)  // buffers are not sharded
      params.push_back({name, param->shape, param->compute_in_fp32, !param->requires_grad, param->adapter_dtype,
                        param->base_quant});
  return fsdp_memory_plan(params, module_names, config, world_size);
}

}  // namespace mmtrain
