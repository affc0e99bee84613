#include "fsdp/fully_shard.h"

#include "core/error.h"
#include "core/module_pattern.h"
#include "fsdp/plan.h"
#include "fsdp/shard_pager.h"
#include "quant/quantized_rows.h"

#include <torch/csrc/autograd/custom_function.h>

#include <ATen/record_function.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

namespace mmtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The autograd Functions carry their unit as a pointer in saved_data: the Fsdp engine outlives
// every graph built while it exists, so the pointer stays valid.
int64_t to_handle(FsdpUnit* unit) { return reinterpret_cast<int64_t>(unit); }
FsdpUnit& from_handle(int64_t handle) { return *reinterpret_cast<FsdpUnit*>(handle); }

// Outputs: one tensor per param of the unit, each a fresh TensorImpl over the unit's gather
// buffer (not an autograd view), so freeing and refilling the buffer is invisible to autograd.
at::Tensor gathered_alias(const FsdpParam& p) {
  auto alias = at::empty({0}, p.gathered.options());
  alias.set_(p.gathered.storage(), 0, p.param->shape, c10::contiguous_strides(p.param->shape));
  return alias;
}

// Outputs: one per trained param (frozen ones are materialized outside autograd).
struct UnitGather : torch::autograd::Function<UnitGather> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& anchor, int64_t handle) {
    ctx->saved_data["unit"] = handle;
    auto& unit = from_handle(handle);
    variable_list outputs;
    for (auto& p : unit.params)
      if (!p.frozen) outputs.push_back(gathered_alias(p));
    return outputs;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& unit = from_handle(ctx->saved_data["unit"].toInt());
    unit.engine->post_backward(unit, grads);
    return {at::Tensor(), at::Tensor()};
  }
};

// Identity whose backward calls the engine's OnGrad(unit) once the gradient of its output exists.
template <void (Fsdp::*OnGrad)(FsdpUnit&)>
struct UnitGradHook : torch::autograd::Function<UnitGradHook<OnGrad>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t handle) {
    ctx->saved_data["unit"] = handle;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& unit = from_handle(ctx->saved_data["unit"].toInt());
    (unit.engine->*OnGrad)(unit);
    return {grads[0], at::Tensor()};
  }
};
// On a unit's output: runs before any of the unit's own backward ops.
using UnitPreBackward = UnitGradHook<&Fsdp::pre_backward>;
// On one input of a unit with frozen params: runs once that input's grad exists, so after every
// op of the unit that needs the unit's weights for it.
using UnitInputGrad = UnitGradHook<&Fsdp::input_grads_done>;

// Installed on every unit's block. In the forward pass: gather (and prefetch), run, reshard,
// and hook the pre-backward re-gather onto the output. In the recompute pass (the block run again
// inside backward, whose graph backpropagates at once): re-gather with backward prefetch and
// materialize the params into that graph; the unit's post-backward then reshards it.
struct UnitHook : BlockHook {
  Fsdp* engine;
  FsdpUnit* unit;

  UnitHook(Fsdp* e, FsdpUnit* u) : engine(e), unit(u) {}

  at::Tensor run(const std::vector<at::Tensor>& inputs, BlockPass pass, const BlockNext& next) override {
    if (pass == BlockPass::recompute) {
      engine->pre_backward(*unit);
      engine->unshard_and_materialize(*unit);
      return next(engine->hook_inputs(*unit, inputs), pass);
    }
    engine->pre_forward(*unit);
    auto out = next(at::GradMode::is_enabled() ? engine->hook_inputs(*unit, inputs) : inputs, pass);
    return engine->post_forward(*unit, out, at::GradMode::is_enabled());
  }
};

// A unit's name in profiler scopes ("fsdp::all_gather layers.3").
std::string profile_name(const char* what, const FsdpUnit& unit) {
  return std::string(what) + " " + (unit.name.empty() ? "(root)" : unit.name);
}

}  // namespace

namespace {

// Reductions kept in flight while the next unit's backward runs (post_backward).
constexpr size_t kReductionsInFlight = kFsdpReductionsInFlight;

// Units gathered at once: the one running and its prefetches.
size_t units_in_flight(const FsdpConfig& config) {
  return 1 + static_cast<size_t>(std::max(config.num_to_forward_prefetch, config.num_to_backward_prefetch));
}

}  // namespace

Fsdp::Fsdp(Module& model, std::shared_ptr<Comm> comm, FsdpConfig config, at::Device device, FsdpReduction reduction,
           std::shared_ptr<OffloadTiers> tiers)
    : comm_(std::move(comm)),
      config_(std::move(config)),
      device_(device),
      reduction_(std::move(reduction)),
      tiers_(config_.cpu_offload ? std::move(tiers) : nullptr),
      // Per reduction in flight, plus the one being issued: staged grads, an output and a receive buffer.
      reduce_buffers_(3 * (kReductionsInFlight + 1)) {
  if (!config_.ignored_modules.empty())
    fail("fsdp_plan.ignored_modules: unsharded modules are not implemented; leave the list empty");
  if (config_.cpu_offload && !tiers_) fail("fsdp_plan.cpu_offload: the FSDP engine was built without offload tiers");
  const int world = comm_->world_size();
  auto root = std::make_unique<FsdpUnit>();
  root->is_root = true;
  units_.push_back(std::move(root));

  auto modules = model.named_modules();
  std::vector<std::string> module_names;
  for (auto& [name, m] : modules) module_names.push_back(name);
  select_blocks(model, config_.apply_modules, "fsdp_plan.apply_modules");  // units are blocks

  // Units and param ownership (deepest unit containing the param, else the root) come from the
  // rule the memory planner shares (fsdp/plan.h), so plans and real shards cannot drift apart.
  std::vector<std::pair<std::string, Param*>> named_params;
  for (auto& entry : model.named_parameters())
    if (entry.second->trainable) named_params.push_back(entry);  // buffers stay whole and untouched
  std::vector<std::string> param_names;
  for (auto& [param_name, param] : named_params) param_names.push_back(param_name);
  const auto assignment = fsdp_assign_units(module_names, param_names, config_.apply_modules);
  for (size_t u = 1; u < assignment.units.size(); ++u) {
    auto unit = std::make_unique<FsdpUnit>();
    unit->name = assignment.units[u];
    for (auto& [name, module] : modules)
      if (name == unit->name) unit->module = module;
    units_.push_back(std::move(unit));
  }
  for (size_t i = 0; i < named_params.size(); ++i) {
    FsdpParam p;
    p.name = named_params[i].first;
    p.param = named_params[i].second;
    p.layout = ShardLayout(p.param->shape, world);
    units_[assignment.owner[i]]->params.push_back(std::move(p));
  }

  auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  for (size_t i = 0; i < units_.size(); ++i) {
    auto& unit = *units_[i];
    unit.order = i;
    std::vector<std::pair<std::string, bool>> fp32_flags;
    for (const auto& p : unit.params)
      if (!p.param->adapter_dtype) fp32_flags.emplace_back(p.name, p.param->compute_in_fp32);  // adapters: their own
    unit.gather_dtype = unit_gather_dtype(unit.name, fp32_flags, config_.param_dtype);
    unit.engine = this;
    int64_t total = 0, frozen_total = 0, quant_total = 0;
    for (auto& p : unit.params) {
      p.frozen = !p.param->requires_grad;
      if (p.param->base_quant != quant::BaseQuant::none) {
        if (!p.frozen || !quant::row_quantizable(p.param->base_quant, p.param->shape))
          fail("fsdp: '", p.name, "' is marked ", quant::base_quant_name(p.param->base_quant),
               " but is trained or not rows of whole blocks");
        p.quant = p.param->base_quant;
        const quant::QuantizedRowShape stored = quant::quantized_row_shape(p.quant, p.param->shape);
        p.quant_layout = ShardLayout({stored.rows, stored.width}, world);
        p.quant_row_bytes = quant::quantized_row_bytes(p.quant, stored.width);
        p.offset = quant_total;
        quant_total += p.quant_layout.padded_rows * p.quant_row_bytes;
        continue;
      }
      int64_t& end = p.frozen ? frozen_total : total;
      p.offset = end;
      end += p.layout.shard_numel();
    }
    const auto frozen_options = fp32.dtype(unit.gather_dtype);
    unit.frozen_flat = tiers_ ? tiers_->host_pool->take_zeros({frozen_total}, unit.gather_dtype)
                              : at::zeros({frozen_total}, frozen_options);
    // (A unit without quantized weights takes nothing from the host pool: its tensors are whole pages.)
    unit.quant_flat = tiers_ && quant_total > 0 ? tiers_->host_pool->take_zeros({quant_total}, at::kByte)
                                                : at::zeros({quant_total}, fp32.dtype(at::kByte));
    if (tiers_ && tiers_->disk) {  // the pager gives them their zeros (the file's) below
      unit.shard_flat = tiers_->host_pool->take({total}, at::kFloat);
      unit.grad_flat = tiers_->host_pool->take_zeros({total}, at::kFloat);
    } else if (tiers_) {
      unit.shard_flat = tiers_->host_pool->take_zeros({total}, at::kFloat);
      unit.grad_flat = tiers_->host_pool->take_zeros({total}, at::kFloat);
    } else {
      unit.shard_flat = at::zeros({total}, fp32);
      unit.grad_flat = at::zeros({total}, fp32);
    }
    unit.anchor = at::zeros({}, fp32).requires_grad_(true);
    for (auto& p : unit.params) {
      std::vector<int64_t> shard_shape = p.param->shape;
      if (shard_shape.empty()) fail("parameter '", p.name, "' is 0-dim: FSDP shards dim 0");
      shard_shape[0] = p.layout.padded_rows;
      std::vector<int64_t> gathered_shape = p.param->shape;
      gathered_shape[0] = p.layout.padded_rows * world;
      if (p.quant != quant::BaseQuant::none) {
        const int64_t rows = p.quant_layout.padded_rows;
        p.shard = unit.quant_flat.narrow(0, p.offset, rows * p.quant_row_bytes).view({rows, p.quant_row_bytes});
        p.quant_gathered = at::empty({rows * world, p.quant_row_bytes}, fp32.dtype(at::kByte));
        release_gather_storage(p.quant_gathered);
      } else {
        p.shard = (p.frozen ? unit.frozen_flat : unit.shard_flat).narrow(0, p.offset, p.layout.shard_numel()).view(shard_shape);
      }
      p.gathered = at::empty(gathered_shape, fp32.dtype(p.param->adapter_dtype.value_or(unit.gather_dtype)));
      release_gather_storage(p.gathered);
    }
  }

  for (auto& unit : units_)
    if (!unit->is_root) unit->module->add_hook(std::make_shared<UnitHook>(this, unit.get()));
  if (tiers_ && tiers_->disk) {
    pager_ = std::make_unique<ShardPager>(tiers_, units());
    pager_->page_out_all(/*changed=*/false);  // the file's regions read as zeros
  }
}

Fsdp::~Fsdp() = default;

bool Fsdp::shard_resident(const FsdpUnit& unit) const { return !pager_ || pager_->resident(unit); }

std::vector<FsdpUnit*> Fsdp::units() {
  std::vector<FsdpUnit*> out;
  for (auto& u : units_) out.push_back(u.get());
  return out;
}

void Fsdp::load_params(const std::function<at::Tensor(const std::string&, int64_t, int64_t)>& read_rows, bool frozen_too,
                       const QuantRowReader& read_quantized) {
  for (auto& unit : units_) {
    if (pager_) pager_->page_in(*unit);
    for (auto& p : unit->params)
      if (frozen_too || !p.frozen) fill_param(p, read_rows, read_quantized);
    if (pager_) pager_->page_out(*unit, /*changed=*/true);
  }
}

void Fsdp::init_params(uint64_t seed) {
  for (auto& unit : units_) {
    if (pager_) pager_->page_in(*unit);
    for (auto& p : unit->params)
      fill_param(
          p,
          [&](const std::string& name, int64_t begin, int64_t end) {
            return param_init_rows(*p.param, name, seed, begin, end);
          },
          {});
    if (pager_) pager_->page_out(*unit, /*changed=*/true);
  }
}

void Fsdp::fill_param(FsdpParam& p, const RowReader& read_rows, const QuantRowReader& read_quantized) {
  if (p.quant == quant::BaseQuant::none) return fill_shard(p, read_rows);
  if (read_quantized) return fill_quantized_shard(p, read_quantized);
  fill_quantized_shard(p, [&](const std::string& name, quant::BaseQuant kind, int64_t begin, int64_t end) {
    const at::Tensor full = read_rows(name, 0, p.layout.dim0);
    return QuantizedRows{quant::quantized_rows(quant::quantize_weight(full.cpu(), kind)).narrow(0, begin, end - begin),
                         full.scalar_type()};
  });
}

void Fsdp::fill_shard(FsdpParam& p, const RowReader& read_rows) {
  const int rank = comm_->rank();
  const int64_t begin = p.layout.row_begin(rank), rows = p.layout.rows(rank);
  at::NoGradGuard no_grad;
  p.shard.zero_();
  if (rows == 0) return;
  auto values = read_rows(p.name, begin, begin + rows);
  std::vector<int64_t> expected = p.param->shape;
  expected[0] = rows;
  if (values.sizes() != at::IntArrayRef(expected))
    fail("loading '", p.name, "' rows [", begin, ", ", begin + rows, "): got shape ", values.sizes(),
         ", expected ", at::IntArrayRef(expected));
  p.shard.narrow(0, 0, rows).copy_(values);
}

void Fsdp::fill_quantized_shard(FsdpParam& p, const QuantRowReader& read_quantized) {
  const int rank = comm_->rank();
  const int64_t begin = p.quant_layout.row_begin(rank), rows = p.quant_layout.rows(rank);
  p.shard.zero_();
  if (rows == 0) return;
  const QuantizedRows got = read_quantized(p.name, p.quant, begin, begin + rows);
  if (got.bytes.scalar_type() != at::kByte || got.bytes.sizes() != at::IntArrayRef({rows, p.quant_row_bytes}))
    fail("loading '", p.name, "' stored rows [", begin, ", ", begin + rows, ") as ", quant::base_quant_name(p.quant),
         ": got ", got.bytes.scalar_type(), " ", got.bytes.sizes(), ", expected uint8 [", rows, ", ", p.quant_row_bytes, "]");
  p.shard.narrow(0, 0, rows).copy_(got.bytes);
  p.public_dtype = got.public_dtype;
}

void Fsdp::dequantize_gathered(FsdpParam& p) {
  RECORD_USER_SCOPE("fsdp::dequantize");
  acquire_gather_storage(p.gathered);
  // [stored rows, stored width] is the weight's [dim0, in] in the same element order.
  const at::Tensor values = quant::dequantize_rows(p.quant_gathered.narrow(0, 0, p.quant_layout.dim0), p.quant,
                                                   p.quant_layout.row_numel, p.public_dtype, p.gathered.scalar_type());
  p.gathered.narrow(0, 0, p.layout.dim0).copy_(values.view({p.layout.dim0, p.layout.row_numel}));
  release_gather_storage(p.quant_gathered);
}

void Fsdp::acquire_gather_storage(const at::Tensor& t) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == nbytes) return;
  auto& free_list = free_gather_storage_[nbytes];
  if (free_list.empty()) {
    storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  } else {
    storage->set_data_ptr_noswap(std::move(free_list.back()));
    free_list.pop_back();
  }
  storage->set_nbytes(nbytes);
}

void Fsdp::release_gather_storage(const at::Tensor& t) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = storage->nbytes();
  auto released = storage->set_data_ptr(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
  // Keep as many buffers of a size as can be in use at once (a unit is resharded before the
  // gather that reuses its buffers); the rest go back to the allocator.
  auto& free_list = free_gather_storage_[nbytes];
  if (nbytes > 0 && free_list.size() < units_in_flight(config_)) free_list.push_back(std::move(released));
}

void Fsdp::unshard_async(FsdpUnit& unit) {
  if (unit.state != FsdpUnit::State::sharded) return;
  RECORD_USER_SCOPE(profile_name("fsdp::all_gather", unit));
  // Each param's shard is cast straight into this rank's block of its gathered buffer, and the
  // in-place all-gather fills the other blocks: the gathered buffer [W * padded_rows, ...] is the
  // ranks' padded shards one after another, so nothing is copied out afterwards.
  const int rank = comm_->rank();
  if (pager_) {  // its shard comes from disk for the copy below, and the next one's starts to
    pager_->page_in(unit);
    const size_t next = in_backward_ ? unit.order - 1 : unit.order + 1;  // backward never gathers the root
    if (in_backward_ ? unit.order > 1 : next < units_.size()) pager_->read_ahead(*units_[next]);
  }
  std::vector<at::Tensor> outs;
  std::vector<CopyEvent> copies;
  for (auto& p : unit.params) {
    const at::Tensor& buffer = p.quant != quant::BaseQuant::none ? p.quant_gathered : p.gathered;
    acquire_gather_storage(buffer);
    auto flat = buffer.view(-1);
    const int64_t n = p.shard.numel();
    if (tiers_)  // cpu_offload: the host shard comes to the device, cast on the way
      copies.push_back(tiers_->copies->to_device(flat.narrow(0, rank * n, n), p.shard.view(-1)));
    else
      flat.narrow(0, rank * n, n).copy_(p.shard.view(-1));
    gathered_bytes_ += (flat.numel() - n) * static_cast<int64_t>(flat.element_size());
    outs.push_back(flat);
  }
  for (auto& copy : copies) {
    copy.wait_on_device();
    if (pager_) copy.wait();  // the host buffer goes back to the pool next
  }
  if (pager_) pager_->page_out(unit, /*changed=*/false);
  unit.gather_work = comm_->all_gather_in_place(std::move(outs));
  unit.state = FsdpUnit::State::gathering;
}

void Fsdp::wait_unshard(FsdpUnit& unit) {
  if (unit.state != FsdpUnit::State::gathering) return;
  {
    RECORD_USER_SCOPE(profile_name("fsdp::wait_all_gather", unit));
    timed_wait(unit.gather_work);
  }
  for (auto& p : unit.params)
    if (p.quant != quant::BaseQuant::none) dequantize_gathered(p);
  unit.state = FsdpUnit::State::unsharded;
}

void Fsdp::unshard_and_materialize(FsdpUnit& unit) {
  unshard_async(unit);
  wait_unshard(unit);
  std::vector<Param*> trained;
  for (auto& p : unit.params) {
    if (p.frozen)
      p.param->value = gathered_alias(p);
    else
      trained.push_back(p.param);
  }
  if (trained.empty()) return;  // nothing of this unit takes a grad
  auto values = UnitGather::apply(unit.anchor, to_handle(&unit));
  for (size_t i = 0; i < trained.size(); ++i) trained[i]->value = values[i];
}

std::vector<at::Tensor> Fsdp::hook_inputs(FsdpUnit& unit, const std::vector<at::Tensor>& inputs) {
  unit.grads_reduced = false;
  unit.inputs_pending = 0;
  if (unit.frozen_flat.numel() == 0) return inputs;
  std::vector<at::Tensor> out;
  for (const auto& x : inputs) {
    if (x.defined() && x.requires_grad()) {
      ++unit.inputs_pending;
      out.push_back(UnitInputGrad::apply(x, to_handle(&unit)));
    } else {
      out.push_back(x);
    }
  }
  return out;
}

void Fsdp::input_grads_done(FsdpUnit& unit) {
  if (unit.inputs_pending > 0) --unit.inputs_pending;
  reshard_if_backward_done(unit);
}

void Fsdp::reshard_if_backward_done(FsdpUnit& unit) {
  // The root's params are used anywhere in the model: it lets go in finish_backward.
  if (unit.is_root || unit.inputs_pending > 0) return;
  bool has_trained = false;
  for (const auto& p : unit.params) has_trained = has_trained || !p.frozen;
  if (has_trained && !unit.grads_reduced) return;  // its reduction (post_backward) comes later
  reshard(unit);
}

void Fsdp::reshard(FsdpUnit& unit) {
  if (unit.state == FsdpUnit::State::sharded) return;
  wait_unshard(unit);
  for (auto& p : unit.params) release_gather_storage(p.gathered);
  unit.state = FsdpUnit::State::sharded;
}

void Fsdp::begin_forward() {
  in_backward_ = false;
  unshard_and_materialize(*units_[0]);
}

void Fsdp::pre_forward(FsdpUnit& unit) {
  unshard_async(unit);
  for (int k = 1; k <= config_.num_to_forward_prefetch; ++k) {
    const size_t next = unit.order + k;
    if (next < units_.size()) unshard_async(*units_[next]);
  }
  unshard_and_materialize(unit);
}

at::Tensor Fsdp::post_forward(FsdpUnit& unit, at::Tensor output, bool install_pre_backward) {
  if (config_.reshard_after_forward && !unit.is_root && !held_) reshard(unit);
  if (install_pre_backward && output.requires_grad())
    output = UnitPreBackward::apply(output, to_handle(&unit));
  return output;
}

void Fsdp::pre_backward(FsdpUnit& unit) {
  in_backward_ = true;
  unshard_async(unit);
  for (int k = 1; k <= config_.num_to_backward_prefetch; ++k) {
    if (unit.order < static_cast<size_t>(k) + 1) break;  // order 0 is the root, never prefetched
    unshard_async(*units_[unit.order - k]);
  }
  wait_unshard(unit);
}

void Fsdp::post_backward(FsdpUnit& unit, const std::vector<at::Tensor>& grads) {
  RECORD_USER_SCOPE(profile_name("fsdp::reduce_scatter", unit));
  const int world = comm_->world_size();
  const int64_t total = unit.shard_flat.numel();
  // Nothing to add to yet (the first micro-batch): reduce straight into grad_flat (with
  // cpu_offload: into a device buffer that is then copied over it).
  const bool overwrite = unit.grad_is_zero && config_.reduce_dtype == at::kFloat;
  const auto reduce_options = at::TensorOptions().dtype(config_.reduce_dtype).device(device_);
  auto output = overwrite && !tiers_ ? unit.grad_flat : reduce_buffers_.take({total}, reduce_options);
  unit.grad_is_zero = false;
  // Rank r's block of a param's grad: its rows [r * padded_rows, (r + 1) * padded_rows). A grad
  // already in reduce_dtype whose rows split evenly is sent from where it lies; the others (a
  // cast, padding rows, unused params: zeros) are staged in rows of `staged` [W, S].
  at::Tensor staged;
  std::vector<at::Tensor> outs;
  std::vector<std::vector<at::Tensor>> blocks;
  size_t i = 0;  // grads[i]: the grad of the i-th trained param
  for (const auto& p : unit.params) {
    if (p.frozen) continue;
    const auto& grad_i = grads[i++];
    const auto& layout = p.layout;
    const int64_t n = layout.shard_numel();
    outs.push_back(output.narrow(0, p.offset, n));
    const bool has_grad = grad_i.defined();
    if (has_grad && grad_i.scalar_type() == config_.reduce_dtype && layout.dim0 == layout.padded_rows * world) {
      auto grad = grad_i.contiguous().view(-1);
      blocks.emplace_back();
      for (int r = 0; r < world; ++r) blocks.back().push_back(grad.narrow(0, r * n, n));
      continue;
    }
    if (!staged.defined()) staged = reduce_buffers_.take({world, total}, reduce_options);
    auto dst = staged.narrow(1, p.offset, n).view({world, layout.padded_rows, layout.row_numel});
    if (!has_grad) {
      dst.zero_();
    } else {
      auto grad = grad_i.reshape({layout.dim0, layout.row_numel});
      for (int r = 0; r < world; ++r) {
        const int64_t rows = layout.rows(r);
        if (rows > 0) dst[r].narrow(0, 0, rows).copy_(grad.narrow(0, layout.row_begin(r), rows));
        if (rows < layout.padded_rows) dst[r].narrow(0, rows, layout.padded_rows - rows).zero_();
      }
    }
    blocks.emplace_back();
    for (int r = 0; r < world; ++r) blocks.back().push_back(staged[r].narrow(0, p.offset, n));
  }
  if (unit.frozen_flat.numel() == 0) {
    reshard(unit);
  } else {
    unit.grads_reduced = true;
    reshard_if_backward_done(unit);
  }
  auto work = comm_->reduce_scatter_sum_blocks(std::move(outs), std::move(blocks), &reduce_buffers_);
  pending_.push_back({&unit, overwrite, staged, output, std::move(work)});
  // A bounded number of reductions in flight overlaps communication with the next unit's
  // backward without holding every unit's grads.
  drain_reductions(kReductionsInFlight);
}

void Fsdp::timed_wait(CommWork& work) {
  const auto started = std::chrono::steady_clock::now();
  work.wait();
  comm_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
}

int64_t Fsdp::take_gathered_bytes() {
  const int64_t bytes = gathered_bytes_;
  gathered_bytes_ = 0;
  return bytes;
}

double Fsdp::take_comm_wait_ms() {
  return std::exchange(comm_wait_ms_, 0.0);
}

void Fsdp::drain_reductions(size_t keep_in_flight) {
  at::NoGradGuard no_grad;
  const double divisor = reduction_.data_parallel > 0 ? reduction_.data_parallel : comm_->world_size();
  while (pending_.size() > keep_in_flight) {
    auto pending = std::move(pending_.front());
    pending_.pop_front();
    {
      RECORD_USER_SCOPE(profile_name("fsdp::wait_reduce_scatter", *pending.unit));
      timed_wait(pending.work);
      if (reduction_.replicate && reduction_.replicate->world_size() > 1) {
        auto replica_work = reduction_.replicate->all_reduce_sum(pending.output);
        timed_wait(replica_work);
      }
    }
    if (divisor > 1) pending.output.div_(divisor);
    auto& grad = pending.unit->grad_flat;
    if (tiers_) {  // cpu_offload: the reduced grad goes to the host, then takes the same add
      if (pending.overwrite) {
        tiers_->copies->to_host(grad, pending.output).wait();
      } else {
        auto host = tiers_->host_pool->take(pending.output.sizes(), pending.output.scalar_type());
        tiers_->copies->to_host(host, pending.output).wait();
        grad.add_(host.to(at::kFloat));
      }
      reduce_buffers_.give(std::move(pending.output));
    } else if (!pending.output.is_same(grad)) {
      grad.add_(pending.output.to(at::kFloat));
      reduce_buffers_.give(std::move(pending.output));
    }
    if (pending.staged.defined()) reduce_buffers_.give(std::move(pending.staged));
  }
}

void Fsdp::finish_backward() {
  drain_reductions(0);
  reduce_buffers_.clear();
  // A unit whose params got no grad at all (unused this step) still has to let go of them.
  for (auto& unit : units_) reshard(*unit);
}

void Fsdp::finish_forward_only() {
  if (in_backward_) fail("fsdp: finish_forward_only() inside a backward (it is for forwards without one)");
  held_ = false;
  for (auto& unit : units_) reshard(*unit);
}

void Fsdp::begin_forward_held() {
  if (at::GradMode::is_enabled()) fail("fsdp: begin_forward_held() is for forwards without grad (generation)");
  begin_forward();
  held_ = true;
}

void Fsdp::zero_grad() {
  for (auto& unit : units_) {
    if (!unit->grad_is_zero) unit->grad_flat.zero_();
    unit->grad_is_zero = true;
  }
}

double Fsdp::clip_grad_norm(double max_norm, bool local_non_finite) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (auto& unit : units_)
    if (unit->grad_flat.numel() > 0) grads.push_back(unit->grad_flat);
  // One fp32 pass per unit (the kernel clip_grad_norm_'s _foreach_norm runs); the units' squares
  // and the ranks' sums add in double.
  double sum_squares = 0.0;
  if (!grads.empty()) sum_squares = at::stack(at::_foreach_norm(grads)).to(at::kDouble).pow(2).sum().item<double>();
  if (local_non_finite) sum_squares = std::numeric_limits<double>::quiet_NaN();
  const double norm = std::sqrt(comm_->all_reduce_sum(sum_squares));
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) at::_foreach_mul_(grads, coef);
  }
  return norm;
}

FsdpMemoryStats Fsdp::memory_stats() const {
  FsdpMemoryStats stats;
  for (auto& unit : units_) {
    stats.param_bytes += unit->shard_flat.numel() * unit->shard_flat.element_size() +
                         unit->frozen_flat.numel() * unit->frozen_flat.element_size() + unit->quant_flat.numel();
    stats.grad_bytes += unit->grad_flat.numel() * unit->grad_flat.element_size();
    for (auto& p : unit->params)
      stats.unsharded_param_bytes += p.layout.dim0 * p.layout.row_numel * p.gathered.element_size();
  }
  return stats;
}

}  // namespace mmtrain
