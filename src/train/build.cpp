#include "train/build.h"

#include "core/error.h"
#include "data/held_out.h"
#include "fsdp/shard_pager.h"
#include "parallel/parallelize.h"
#include "train/hf_weights.h"

namespace mmtrain {

std::shared_ptr<Model> build_model(const Config& config) {
  const ModelSpec& spec = config_model_spec(config);
  auto model = spec.build(config.model.config);
  if (config.features.enable_lora)
    apply_lora(*model, config.features.lora, spec.lora_default_targets, spec.lora_supported_targets);
  return model;
}

DeviceMesh build_mesh(const ParallelDims& dims, const Runtime& runtime) {
  if (dims.world == 1) return DeviceMesh::single(runtime.comm);
  return DeviceMesh(dims.mesh(), runtime.comm, runtime.store, runtime.device);
}

std::unique_ptr<Fsdp> parallelize_model(const Config& config, Model& model, const DeviceMesh& mesh,
                                        std::shared_ptr<OffloadTiers> tiers) {
  if (!tiers) tiers = OffloadTiers::make(mesh.world()->device());
  return parallelize(model, parallelize_plan(config.parallel, config.features), mesh, std::move(tiers));
}

AdamWOptions adamw_options(const TrainingConfig& t) {
  return AdamWOptions{t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay};
}

namespace {

// Shards on disk (cpu_offload with offload_dir): each unit comes in for its update, the next one
// read behind it, and goes back written.
void page_shards_around_updates(Optimizer& optimizer, Fsdp& fsdp) {
  ShardPager* pager = fsdp.shard_pager();
  if (!pager) return;
  optimizer.set_residency([pager, units = fsdp.units()](size_t u) { pager->page_in_reading_next(*units[u]); },
                          [pager, units = fsdp.units()](size_t u) { pager->page_out(*units[u], /*changed=*/true); });
}

}  // namespace

std::unique_ptr<AdamW> make_fsdp_adamw(Fsdp& fsdp, const AdamWOptions& options,
                                       const std::shared_ptr<OffloadTiers>& tiers) {
  std::vector<at::Tensor> params, grads;
  const auto units = fsdp.units();
  for (auto* unit : units) {
    params.push_back(unit->shard_flat);
    grads.push_back(unit->grad_flat);
  }
  AdamW::MomentAllocator moments;  // default: zeros like the param, where it is
  if (fsdp.config().cpu_offload) {
    if (!tiers) fail("fsdp_plan.cpu_offload: make_fsdp_adamw was given no offload tiers");
    moments = [pool = tiers->host_pool](const at::Tensor& param) { return pool->take_zeros(param.sizes(), at::kFloat); };
  }
  auto adamw = std::make_unique<AdamW>(params, grads, options, moments);
  page_shards_around_updates(*adamw, fsdp);
  return adamw;
}

std::vector<std::vector<ShardedParamSpan>> fsdp_param_spans(Fsdp& fsdp) {
  std::vector<std::vector<ShardedParamSpan>> spans;
  const int world = fsdp.comm().world_size();
  for (auto* unit : fsdp.units()) {
    auto& unit_spans = spans.emplace_back();
    for (const auto& param : unit->params) {
      if (param.frozen) continue;
      ShardedParamSpan span{param.name, param.offset, param.layout.dim0 * param.layout.row_numel, {}};
      for (int r = 0; r < world; ++r) span.rank_begins.push_back(param.layout.row_begin(r) * param.layout.row_numel);
      span.rank_begins.push_back(span.numel);
      unit_spans.push_back(std::move(span));
    }
  }
  return spans;
}

std::unique_ptr<Optimizer> make_fsdp_optimizer(Fsdp& fsdp, const TrainingConfig& training,
                                               const std::shared_ptr<OffloadTiers>& tiers) {
  if (training.optimizer != "adamw8bit") return make_fsdp_adamw(fsdp, adamw_options(training), tiers);
  if (fsdp.shard_device().type() != at::kCPU)
    fail("training.optimizer adamw8bit: its update is bitsandbytes' CPU kernel and needs the shards in host memory; ",
         "on ", fsdp.shard_device(), " set parallel.fsdp_plan.cpu_offload: true, or use training.optimizer adamw");
  std::vector<at::Tensor> params, grads;
  for (auto* unit : fsdp.units()) {
    params.push_back(unit->shard_flat);
    grads.push_back(unit->grad_flat);
  }
  AdamW8bit::StateAllocator allocate;  // default: zeros in RAM
  if (fsdp.config().cpu_offload) {
    if (!tiers) fail("fsdp_plan.cpu_offload: make_fsdp_optimizer was given no offload tiers");
    allocate = [pool = tiers->host_pool](int64_t numel, at::ScalarType dtype, const at::Tensor&) {
      return pool->take_zeros({numel}, dtype);
    };
  }
  Comm* comm = &fsdp.comm();  // the shard group: the ranks that hold a straddling block's parts
  auto all_reduce_max = [comm](at::Tensor& absmax) {
    at::Tensor on_comm = absmax.to(comm->device());  // NCCL reduces device tensors only
    comm->all_reduce_max(on_comm).wait();
    absmax.copy_(on_comm);
  };
  // training.offload_dir: the 8-bit state on the disk tier (with cpu_offload, the shards too).
  auto optimizer = std::make_unique<AdamW8bit>(params, grads, fsdp_param_spans(fsdp), comm->rank(),
                                               AdamW8bitOptions{adamw_options(training), training.min_8bit_size},
                                               all_reduce_max, allocate, tiers ? tiers->disk : nullptr);
  page_shards_around_updates(*optimizer, fsdp);
  return optimizer;
}

int64_t load_initial_weights(const Config& config, Model& model, Fsdp& fsdp) {
  const std::string& path = config.model.weights_path();
  if (path.empty()) {
    fsdp.init_params(config.training.seed);
    init_buffers(model, fsdp.device());
    return 0;
  }
  const auto adapter = make_hf_adapter(config_model_spec(config), config.model.config);
  return load_hf_weights(model, *adapter, fsdp, WeightSource(path), config.training.seed);
}

namespace {

// Token-budget micro-batches: each sample's tokens as the data set reads them (Dataset::
// sample_tokens: headers where the format allows) and its cost by the model's FLOPs rule for one
// sample of that length (ModelSpec::flops, the planner's rule: attention's quadratic term
// included); by its tokens when the model has no FLOPs rule.
SampleLoadFn sample_loads(const Config& c, std::shared_ptr<const Dataset> dataset) {
  const std::string where = "config " + c.source_path + ": data.dataloader_param.micro_batch_tokens: ";
  if (!dataset->sample_tokens(0))
    fail(where, "the data set '", c.data.dataset_type, "' cannot say how many tokens a sample has, which a token ",
         "budget needs (use micro_batch_size instead)");
  const ModelSpec& spec = config_model_spec(c);
  const nlohmann::json model_config = c.model.config;
  return [dataset, flops = spec.flops, model_config](int64_t index) {
    const auto tokens = dataset->sample_tokens(index);
    if (!tokens) fail("data set: ", dataset->describe(index), " cannot say how many tokens it has");
    SampleLoad load{*tokens, static_cast<double>(*tokens)};
    if (flops) {
      FlopsQuery query;
      query.seqlens = {*tokens};
      load.cost = flops(model_config, query).flops_per_sample;
    }
    return load;
  };
}

}  // namespace

DataPipeline build_data(const Config& c, int dp_rank, int dp_world) {
  const auto& loader = c.data.loader;
  config_check_token_budget(c);
  DataPipeline data;
  data.dataset = build_dataset(c);
  if (c.data.validation_split > 0.0) {  // the held-out samples are not the training set's
    const int64_t n = data.dataset->size();
    auto kept = remaining_indices(n, held_out_indices(n, c.data.validation_split, c.training.seed));
    data.dataset = std::make_shared<SubsetDataset>(data.dataset, std::move(kept));
  }
  data.collator = collator_registry().get(c.data.collate_model_name,
                                          "config " + c.source_path + ": data.dataloader_param.collate_param.model_name")(
      c.data, c.model);
  SamplerOptions sampling;
  sampling.num_samples = data.dataset->size();
  sampling.micro_batch_size = c.training.micro_batch_size;
  sampling.gradient_accumulation_steps = c.training.gradient_accumulation_steps;
  sampling.dp_world = dp_world;
  sampling.dp_rank = dp_rank;
  sampling.shuffle = c.data.loader.shuffle;
  sampling.drop_last = c.data.loader.drop_last;
  sampling.seed = c.training.seed;
  sampling.micro_batch_tokens = loader.micro_batch_tokens;
  sampling.balance_dp = loader.balance_dp;
  sampling.skip_over_budget = loader.over_budget_samples == "skip";
  const int64_t global_batch = int64_t{sampling.micro_batch_size} * sampling.gradient_accumulation_steps * dp_world;
  if (c.data.validation_split > 0.0 && sampling.num_samples < global_batch)
    fail("config ", c.source_path, ": data.validation_split ", c.data.validation_split, " leaves ", sampling.num_samples,
         " training samples, fewer than one global batch of ", global_batch, ": hold out less, or use data.validation");
  data.sampler = GlobalBatchSampler(
      sampling, loader.micro_batch_tokens > 0 ? sample_loads(c, data.dataset) : SampleLoadFn{});
  data.seed = c.training.seed;
  return data;
}

nlohmann::json held_out_draw(const Config& c, const Dataset& training) {
  if (c.data.validation_split <= 0.0) return nullptr;
  const auto* split = dynamic_cast<const SubsetDataset*>(&training);
  if (!split) fail("config ", c.source_path, ": data.validation_split: the training data set is not the split one");
  return {{"validation_split", c.data.validation_split}, {"seed", c.training.seed}, {"samples", split->base()->size()}};
}

std::string held_out_draw_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  if (saved.is_null() && now.is_null()) return "";
  if (saved.is_null())
    return "data.validation_split " + now["validation_split"].dump() + " holds samples out now, and the checkpoint's "
           "run trained on every sample (held-out samples it trained on would be evaluated)";
  if (now.is_null())
    return "the checkpoint's run held " + saved.value("validation_split", nlohmann::json()).dump() + " of its data out "
           "(data.validation_split), and this config holds none out (its training would see them)";
  // Each recorded key as a sentence: what it is now, then what the checkpoint's run had.
  struct Said {
    const char *key, *now, *then;
  };
  for (const Said& said : {Said{"validation_split", "data.validation_split is ", ", the checkpoint's run's was "},
                           Said{"seed", "training.seed is ", ", the checkpoint's run's was "},
                           Said{"samples", "the data set holds ", " samples, the checkpoint's run's held "}})
    if (saved.contains(said.key) && saved[said.key] != now[said.key])  // an older checkpoint records no "samples"
      return std::string("the held-out set would be drawn anew: ") + said.now + now[said.key].dump() + said.then +
             saved[said.key].dump() + " (samples trained on would become validation samples); keep them as they were, "
             "or start a new run";
  return "";
}

std::shared_ptr<Dataset> build_validation_dataset(const Config& c, const std::shared_ptr<Dataset>& training) {
  if (!c.data.validation.empty()) {
    Config validation = c;
    validation.data = c.data.validation_data();
    const std::string where = "config " + c.source_path + ": data.validation";
    std::shared_ptr<Dataset> dataset;
    try {
      dataset = build_dataset(validation);
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
    if (dataset->size() == 0) fail(where, ": the validation set is empty");
    return dataset;
  }
  if (c.data.validation_split > 0.0) {
    const auto* split = dynamic_cast<const SubsetDataset*>(training.get());
    if (!split) fail("config ", c.source_path, ": data.validation_split: the training data set is not the split one");
    const auto& base = split->base();
    return std::make_shared<SubsetDataset>(base, held_out_indices(base->size(), c.data.validation_split, c.training.seed));
  }
  return nullptr;
}

}  // namespace mmtrain
