#include "train/trainer.h"

#include "core/dtype.h"
#include "core/error.h"
#include "optim/lr_schedule.h"
#include "train/build.h"
#include "train/state.h"
#include "train/train_step.h"

#include <ATen/Context.h>

#include <chrono>
#include <cmath>
#include <cstdio>

namespace mmtrain {

struct Trainer::State {
  Config config;
  Runtime runtime;
  std::unique_ptr<DeviceMesh> mesh;
  std::shared_ptr<Model> model;
  std::unique_ptr<Fsdp> fsdp;
  std::unique_ptr<AdamW> adamw;
  LrSchedule schedule;
  DataPipeline data;
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
    mesh = std::make_unique<DeviceMesh>(build_mesh(c, runtime));
    if (mesh->shape().world() > 1) log("device mesh " + mesh->describe());
    model = build_model(c);
    fsdp = parallelize_model(c, *model, *mesh);
    adamw = make_fsdp_adamw(*fsdp, adamw_options(c.training));
    schedule = LrSchedule::make(c.training.lr, c.training.lr_min, c.training.lr_warmup_ratio, c.training.train_iters,
                                c.training.lr_decay_style);
    data = build_data(c, mesh->dp_rank(), mesh->dp_size());
    if (const auto summary = data.dataset->summary(); !summary.empty()) log(summary);

    const auto stats = fsdp->memory_stats();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "rank %d holds params %.2f MiB, grads %.2f MiB, optimizer state %.2f MiB (full model in param_dtype: %.2f MiB, %zu FSDP units)",
                  comm().rank(), stats.param_bytes / 1048576.0, stats.grad_bytes / 1048576.0,
                  adamw->state_bytes() / 1048576.0, stats.unsharded_param_bytes / 1048576.0, fsdp->units().size());
    log(line);
  }

  void load_weights() {
    const std::string& path = config.model.weights_path();
    const int64_t conversions = load_initial_weights(config, *model, *fsdp);
    if (path.empty()) {
      log("no model weights given: random init with seed " + std::to_string(config.training.seed));
    } else {
      std::printf("[mmtrain] rank %d loaded %s (%lld tensors with a converted layout)\n", comm().rank(), path.c_str(),
                  static_cast<long long>(conversions));
    }
  }

  void save(int64_t step) {
    const auto& plan = config.parallel.fsdp_plan;
    StateInfo info;
    info.iteration = step;
    info.global_batch_size = data.sampler.global_batch_size();
    info.model_id = config.model.model_id;
    info.config = config_to_json(config);
    info.plan = {{"apply_modules", plan.apply_modules},
                 {"param_dtype", dtype_name(plan.param_dtype)},
                 {"reduce_dtype", dtype_name(plan.reduce_dtype)},
                 {"sharding", "dim0 torch.chunk"}};
    log("saved checkpoint " + state_save(config.training.save, comm(), *model, *fsdp, adamw.get(), info));
  }

  void resume(const std::string& path) {
    StateLoadOptions options;
    options.model_id = config.model.model_id;
    options.global_batch_size = data.sampler.global_batch_size();
    options.load_optimizer = !config.training.no_load_optim;
    options.load_rng = !config.training.no_load_rng;
    const auto loaded = state_load(path, comm(), *model, *fsdp, *adamw, options);
    if (loaded.model_only) {
      log("initialized from model-only checkpoint " + loaded.dir);
      return;
    }
    start_step = loaded.iteration;
    log("resumed from " + loaded.dir + " at iteration " + std::to_string(start_step) + " (saved on " +
        std::to_string(loaded.saved_world_size) + " ranks, now " + std::to_string(comm().world_size()) + ")");
  }

  void train() {
    const auto& t = config.training;
    MetricsLog metrics(config.logging.output_dir, is_rank0(), config.logging.progress);
    const int world = comm().world_size();
    const int accum = t.gradient_accumulation_steps;
    for (int64_t step = start_step; step < t.train_iters; ++step) {
      const auto started = std::chrono::steady_clock::now();
      StepSettings settings;
      settings.iteration = step + 1;
      settings.accumulation = accum;
      settings.lr = schedule.at(step);
      settings.clip_grad = t.clip_grad;
      const auto stats = train_step(*model, *fsdp, *adamw, settings, [&](int micro) {
        auto batch = data.micro_batch(step, micro);
        for (auto& [key, tensor] : batch) tensor = tensor.to(comm().device());
        return batch;
      });
      const auto totals = comm().all_reduce_sum(std::vector<double>{stats.loss_sum, stats.flops, stats.tokens});
      const double rss_mb = comm().all_reduce_max(std::vector<double>{peak_rss_mb()})[0];
      const double step_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();

      nlohmann::json record = {{"iteration", step + 1},
                               {"consumed_samples", (step + 1) * data.sampler.global_batch_size()},
                               {"global_batch_size", data.sampler.global_batch_size()},
                               {"loss", totals[0] / (accum * world)},
                               {"grad_norm", stats.grad_norm},
                               {"lr", settings.lr},
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
