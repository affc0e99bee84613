#include "train/trainer.h"

#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "data/dataset.h"
#include "fsdp/fully_shard.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "train/build.h"
#include "train/metrics.h"
#include "train/weights.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>

namespace mmtrain {
namespace {

std::string to_hex(const at::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  auto b = bytes.contiguous();
  const auto* data = b.data_ptr<uint8_t>();
  std::string out;
  for (int64_t i = 0; i < b.numel(); ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

at::Tensor from_hex(const std::string& hex) {
  auto out = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  auto* data = out.data_ptr<uint8_t>();
  auto value = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i + 1 < hex.size(); i += 2) data[i / 2] = static_cast<uint8_t>(value(hex[i]) * 16 + value(hex[i + 1]));
  return out;
}

std::string dtype_name(at::ScalarType t) { return c10::toString(t); }

}  // namespace

struct Trainer::State {
  Config config;
  Runtime runtime;
  std::shared_ptr<Model> model;
  std::unique_ptr<Fsdp> fsdp;
  std::unique_ptr<AdamW> adamw;
  LrSchedule schedule;
  std::shared_ptr<Dataset> dataset;
  std::shared_ptr<Collator> collator;
  GlobalBatchSampler sampler;
  int64_t start_step = 0;  // optimizer steps already taken

  Comm& comm() { return *runtime.comm; }
  bool is_rank0() const { return runtime.env.rank == 0; }

  void log(const std::string& message) {
    if (is_rank0()) std::printf("[mmtrain] %s\n", message.c_str());
    std::fflush(stdout);
  }

  void build() {
    const auto& c = config;
    config_check_supported(c, comm().world_size());
    // Deterministic kernels only (an op without one raises); the CPU kernels and the Gloo sums
    // used here are deterministic anyway, this matters on CUDA.
    if (c.training.use_deter_comp) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    model = build_model(c);
    auto options = fsdp_options(c);
    options.device = comm().device();
    fsdp = std::make_unique<Fsdp>(*model, runtime.comm, options);

    adamw = make_fsdp_adamw(*fsdp, AdamWOptions{c.training.adam_beta1, c.training.adam_beta2, c.training.adam_eps,
                                                c.training.weight_decay});
    schedule = LrSchedule::make(c.training.lr, c.training.lr_min, c.training.lr_warmup_ratio, c.training.train_iters,
                                c.training.lr_decay_style);

    dataset = dataset_registry().get(c.data.dataset_type, "config " + c.source_path + ": data.dataset_param.dataset_type")(c);
    collator = collator_registry().get(c.data.collate_model_name,
                                       "config " + c.source_path + ": data.dataloader_param.collate_param.model_name")(c);
    if (const auto summary = dataset->summary(); !summary.empty()) log(summary);
    sampler.num_samples = dataset->size();
    sampler.micro_batch_size = c.training.micro_batch_size;
    sampler.gradient_accumulation_steps = c.training.gradient_accumulation_steps;
    sampler.dp_world = comm().world_size();
    sampler.dp_rank = comm().rank();

    const auto stats = fsdp->memory_stats();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "rank %d holds params %.2f MiB, grads %.2f MiB, optimizer state %.2f MiB (full model in param_dtype: %.2f MiB, %zu FSDP units)",
                  comm().rank(), stats.param_bytes / 1048576.0, stats.grad_bytes / 1048576.0,
                  adamw->state_bytes() / 1048576.0, stats.unsharded_param_bytes / 1048576.0, fsdp->units().size());
    log(line);
  }

  void load_weights() {
    const auto& m = config.model;
    const std::string path = !m.checkpoint_path.empty() ? m.checkpoint_path : m.model_name_or_path;
    const int64_t conversions = load_initial_weights(config, *model, *fsdp);
    if (path.empty()) {
      log("no model weights given: random init with seed " + std::to_string(config.training.seed));
    } else {
      std::printf("[mmtrain] rank %d loaded %s (%lld tensors with a converted layout)\n", comm().rank(), path.c_str(),
                  static_cast<long long>(conversions));
    }
  }

  // Every tensor a checkpoint holds: params, buffers and AdamW moments, this rank's real rows.
  std::vector<ShardedTensor> sharded_state() {
    auto out = model_sharded_tensors(*model, *fsdp, comm().rank());
    const int rank = comm().rank();
    auto units = fsdp->units();
    for (size_t u = 0; u < units.size(); ++u) {
      auto& state = adamw->states()[u];
      for (auto& p : units[u]->params) {
        auto rows_of = [&](const at::Tensor& flat) {
          return p.view_of(flat).narrow(0, 0, p.layout.rows(rank));
        };
        const int64_t begin = p.layout.row_begin(rank);
        out.push_back({"optim.exp_avg." + p.name, p.param->shape, begin, rows_of(state.exp_avg)});
        out.push_back({"optim.exp_avg_sq." + p.name, p.param->shape, begin, rows_of(state.exp_avg_sq)});
      }
    }
    return out;
  }

  nlohmann::json plan_json() const {
    return {{"apply_modules", config.parallel.fsdp_plan.apply_modules},
            {"param_dtype", dtype_name(config.parallel.fsdp_plan.param_dtype)},
            {"reduce_dtype", dtype_name(config.parallel.fsdp_plan.reduce_dtype)},
            {"sharding", "dim0 torch.chunk"}};
  }

  void save(int64_t step) {
    nlohmann::json global = {{"iteration", step},
                             {"consumed_samples", step * sampler.global_batch_size()},
                             {"global_batch_size", sampler.global_batch_size()},
                             {"optimizer_step", adamw->step_count()},
                             {"model_id", config.model.model_id},
                             {"config", config_to_json(config)}};
    nlohmann::json rank_state = {{"cpu_rng_state", to_hex(at::detail::getDefaultCPUGenerator().get_state())}};
    auto dir = checkpoint_save(config.training.save, step, comm(), sharded_state(), global, rank_state, plan_json());
    log("saved checkpoint " + dir);
  }

  void resume(const std::string& path) {
    CheckpointReader reader(path);
    const auto& global = reader.global_state();
    if (global.at("model_id").get<std::string>() != config.model.model_id)
      fail("cannot resume from ", reader.dir(), ": it holds model '", global.at("model_id").get<std::string>(),
           "', the config builds '", config.model.model_id, "'");
    // A model-only checkpoint (`mmtrain convert ... hf-to-ckpt`) starts a fresh run from its weights.
    if (global.value("model_only", false)) {
      load_checkpoint_model(*model, *fsdp, reader);
      log("initialized from model-only checkpoint " + reader.dir());
      return;
    }
    const int64_t saved_gbs = global.at("global_batch_size").get<int64_t>();
    if (saved_gbs != sampler.global_batch_size())
      fail("cannot resume from ", reader.dir(), ": it was trained with global batch size ", saved_gbs,
           " (world size ", reader.saved_world_size(), "), this run has ", sampler.global_batch_size(), " (world size ",
           comm().world_size(), " x micro_batch_size ", sampler.micro_batch_size, " x gradient_accumulation_steps ",
           sampler.gradient_accumulation_steps, "); choose micro_batch_size/gradient_accumulation_steps so they match");
    auto read_prefixed = [&](const std::string& prefix) {
      return [&reader, prefix](const std::string& name, int64_t b, int64_t e) {
        const auto key = prefix + name;
        if (!reader.contains(key)) fail("checkpoint ", reader.dir(), ": missing tensor '", key, "'");
        return reader.read_rows(key, b, e);
      };
    };
    load_checkpoint_model(*model, *fsdp, reader);
    if (!config.training.no_load_optim) {
      auto units = fsdp->units();
      const int rank = comm().rank();
      for (size_t u = 0; u < units.size(); ++u) {
        auto& state = adamw->states()[u];
        for (auto& p : units[u]->params) {
          const int64_t rows = p.layout.rows(rank), begin = p.layout.row_begin(rank);
          for (auto& [prefix, flat] : {std::pair<std::string, at::Tensor>{"optim.exp_avg.", state.exp_avg},
                                       std::pair<std::string, at::Tensor>{"optim.exp_avg_sq.", state.exp_avg_sq}}) {
            auto view = p.view_of(flat);
            view.zero_();
            if (rows > 0) view.narrow(0, 0, rows).copy_(read_prefixed(prefix)(p.name, begin, begin + rows));
          }
        }
      }
      adamw->set_step_count(global.at("optimizer_step").get<int64_t>());
    }
    if (!config.training.no_load_rng && reader.saved_world_size() == comm().world_size()) {
      const auto rank_state = reader.rank_state(comm().rank());
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      generator.set_state(from_hex(rank_state.at("cpu_rng_state").get<std::string>()));
    }
    start_step = global.at("iteration").get<int64_t>();
    log("resumed from " + reader.dir() + " at iteration " + std::to_string(start_step) + " (saved on " +
        std::to_string(reader.saved_world_size()) + " ranks, now " + std::to_string(comm().world_size()) + ")");
  }

  void train() {
    const auto& t = config.training;
    MetricsLog metrics(config.logging.output_dir, is_rank0(), config.logging.progress);
    const int world = comm().world_size();
    const int accum = t.gradient_accumulation_steps;
    for (int64_t step = start_step; step < t.train_iters; ++step) {
      const auto started = std::chrono::steady_clock::now();
      const double lr = schedule.at(step);
      fsdp->zero_grad();
      double loss_sum = 0, flops = 0, tokens = 0;
      for (int m = 0; m < accum; ++m) {
        std::vector<Batch> samples;
        for (int64_t index : sampler.indices(step, m)) samples.push_back(dataset->get(index));
        auto generator = collate_generator(t.seed, sampler.first_position(step, m));
        auto batch = collator->collate(samples, generator);
        for (auto& [key, tensor] : batch) tensor = tensor.to(comm().device());
        fsdp->begin_forward();
        auto out = model->forward(batch);
        (out.loss / accum).backward();
        fsdp->finish_backward();
        loss_sum += out.loss.item<double>();
        flops += model->train_flops(batch);
        tokens += static_cast<double>(out.tokens);
      }
      const double grad_norm = fsdp->clip_grad_norm(t.clip_grad);
      if (!std::isfinite(grad_norm)) fail("iteration ", step + 1, ": grad norm is ", grad_norm, " (NaN/Inf): stopping");
      adamw->step(lr);
      const auto totals = comm().all_reduce_sum(std::vector<double>{loss_sum, flops, tokens});
      const double rss_mb = comm().all_reduce_max(std::vector<double>{peak_rss_mb()})[0];
      const double step_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();

      nlohmann::json record = {{"iteration", step + 1},
                               {"consumed_samples", (step + 1) * sampler.global_batch_size()},
                               {"global_batch_size", sampler.global_batch_size()},
                               {"loss", totals[0] / (accum * world)},
                               {"grad_norm", grad_norm},
                               {"lr", lr},
                               {"step_time_ms", step_ms},
                               {"tokens", static_cast<int64_t>(totals[2])},
                               {"peak_rss_mb", rss_mb}};
      if (totals[1] > 0) {
        const double tflops = totals[1] / world / (step_ms / 1000.0) / 1e12;
        record["tflops_per_device"] = tflops;
        if (config.logging.hardware_flops > 0) record["mfu"] = tflops * 1e12 / config.logging.hardware_flops;
      }
      if (!std::isfinite(record["loss"].get<double>())) fail("iteration ", step + 1, ": loss is NaN/Inf: stopping");
      if ((step + 1) % t.log_interval == 0 || step + 1 == t.train_iters) metrics.record(record, t.train_iters);

      const bool exiting = t.exit_interval > 0 && (step + 1) % t.exit_interval == 0;
      const bool last = step + 1 == t.train_iters || exiting;
      if (!t.save.empty() && (last || (t.save_interval > 0 && (step + 1) % t.save_interval == 0))) save(step + 1);
      if (exiting) {
        log("exit_interval " + std::to_string(t.exit_interval) + " reached at iteration " + std::to_string(step + 1));
        break;
      }
    }
  }
};

Trainer::Trainer(Config config, Runtime runtime) : state_(std::make_unique<State>()) {
  state_->config = std::move(config);
  state_->runtime = std::move(runtime);
  state_->build();
  if (!state_->config.training.load.empty()) {
    state_->resume(state_->config.training.load);
  } else {
    state_->load_weights();
  }
}

Trainer::~Trainer() = default;

void Trainer::run() { state_->train(); }

}  // namespace mmtrain
