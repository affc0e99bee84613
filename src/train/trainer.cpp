#include "train/trainer.h"

#include "checkpoint/async_checkpoint.h"
#include "core/error.h"
#include "core/text.h"
#include "dist/node_names.h"
#include "models/flops_report.h"
#include "offload/host_store.h"
#include "optim/lr_schedule.h"
#include "train/build.h"
#include "train/device_memory.h"
#include "train/device_profile.h"
#include "train/length_mix.h"
#include "train/memory_profile.h"
#include "train/offload_plan.h"
#include "train/preflight.h"
#include "train/profiler.h"
#include "train/run_prediction.h"
#include "train/save_root_lock.h"
#include "train/state.h"
#include "train/train_step.h"

#include <ATen/Context.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <optional>
#include <random>

namespace mmtrain {

struct Trainer::State {
  Config config;
  Runtime runtime;
  std::unique_ptr<DeviceMesh> mesh;
  std::shared_ptr<Model> model;
  std::shared_ptr<OffloadTiers> tiers;  // the offload features' host pool, copy stream and counters
  std::unique_ptr<Fsdp> fsdp;
  std::unique_ptr<AdamW> adamw;
  LrSchedule schedule;
  DataPipeline data;
  std::unique_ptr<MemoryProfile> memory_profile;
  PhaseTimer phase_timer;  // every step: metrics.jsonl phases_ms
  std::unique_ptr<StepProfiler> profiler;
  std::unique_ptr<SaveRootLock> save_lock;  // rank 0, while training.save is set
  std::unique_ptr<AsyncCheckpointSaver> async_saver;  // training.async_save
  int64_t start_step = 0;  // optimizer steps already taken
  std::string lineage;     // this run's line of checkpoints (sharded_checkpoint.h): continued on resume
  StateFiniteness finiteness;  // whether a step made a weight NaN/Inf (train/state_finite.h)
  double baseline_rss_mb = 0;  // before the model is built: the runtime and the data pipeline
  std::optional<RunPrediction> prediction;  // the plan's for this run, from its first step
  bool peak_over_prediction_said = false;

  Comm& comm() { return *runtime.comm; }
  bool is_rank0() const { return runtime.env.rank == 0; }

  void log(const std::string& message) {
    if (is_rank0()) std::printf("[mmtrain] %s\n", message.c_str());
    std::fflush(stdout);
  }

  void build() {
    config_resolve_world(config, comm().world_size());  // accumulation derived from a pinned global batch
    const auto& c = config;
    const ParallelDims dims = config_check_supported(c, comm().world_size());
    // Before any model tensor exists, so that the counting allocator sees all of them.
    if (c.tools.memory_profile.enable && comm().device().is_cuda())
      fail("config ", c.source_path, ": tools.memory_profile counts CPU tensor memory; on CUDA use "
           "tools.profile.with_memory (the caching allocator's events) instead");
    memory_profile = std::make_unique<MemoryProfile>(c.tools.memory_profile);
    // Deterministic kernels only (an op without one raises); the CPU kernels and the Gloo sums
    // used here are deterministic anyway, this matters on CUDA.
    if (c.training.use_deter_comp) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    // The process's default generators (CPU, and CUDA's): mmtrain's own randomness takes explicit
    // generators, but a plugin or an op called without one draws from these, and a checkpoint saves
    // their state (cpu_rng_state): a function of training.seed and the rank, never of the process.
    // A resume restores the saved state over it.
    at::manual_seed(c.training.seed * 1000003ULL + static_cast<uint64_t>(comm().rank()));
    preflight_paths(c, comm().rank());
    lock_save_root();
    if (c.training.async_save) async_saver = std::make_unique<AsyncCheckpointSaver>(comm());
    mesh = std::make_unique<DeviceMesh>(build_mesh(dims, runtime));
    if (mesh->shape().world() > 1) log("device mesh " + mesh->describe());
    // The data first (a bad path or file fails in seconds), then the model as shapes, checked
    // against the memory there is before its shards are allocated.
    data = build_data(c, mesh->dp_rank(), mesh->dp_size());
    if (const auto summary = data.dataset->summary(); !summary.empty()) log(summary);
    if (!c.logging.device_profile.empty()) load_device_profile(c.logging.device_profile);  // a bad one fails now
    baseline_rss_mb = current_rss_mb();
    model = build_model(c);
    preflight_memory(c, *model, runtime.env, runtime.device, dims.fsdp());
    tiers = OffloadTiers::make(comm().device());
    if (!c.training.offload_dir.empty())  // the disk tier: moments, and with cpu_offload the shards
      tiers->disk = std::make_shared<DiskStore>(c.training.offload_dir, comm().rank(), tiers->host_pool);
    fsdp = parallelize_model(c, *model, *mesh, tiers);
    adamw = make_fsdp_adamw(*fsdp, adamw_options(c.training), tiers);
    if (OffloadSetting::of(c).swap) offload_moments();
    schedule = LrSchedule::make(c.training.lr, c.training.lr_min, c.training.lr_warmup_ratio, c.training.train_iters,
                                c.training.lr_decay_style);
    const std::string trace_dir =
        c.tools.profile.save_path.empty() ? c.logging.output_dir + "/profile" : c.tools.profile.save_path;
    profiler = std::make_unique<StepProfiler>(c.tools.profile, comm().rank(), trace_dir, comm().device().is_cuda());
    log(describe_data_order());
    if (c.data.loader.pin_memory && !comm().device().is_cuda())
      log("data.dataloader_param.pin_memory: no effect on " + comm().device().str() + " (batches are not copied)");

    const auto stats = fsdp->memory_stats();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "rank %d holds params %.2f MiB, grads %.2f MiB, optimizer state %.2f MiB (full model in param_dtype: %.2f MiB, %zu FSDP units)",
                  comm().rank(), stats.param_bytes / 1048576.0, stats.grad_bytes / 1048576.0,
                  adamw->state_bytes() / 1048576.0, stats.unsharded_param_bytes / 1048576.0, fsdp->units().size());
    log(line);
  }

  // What the offload tiers have moved so far, and the time waited on them: the copies and the
  // shard pager count themselves (OffloadStats); the disk tier's bytes are its store's, and the
  // moments' waits for it are theirs.
  OffloadCounts offload_counts() const {
    tiers->stats->settle_device_waits();
    OffloadCounts counts = tiers->stats->snapshot();
    if (tiers->disk) {
      counts.disk_read_bytes = tiers->disk->bytes_read();
      counts.disk_written_bytes = tiers->disk->bytes_written();
      if (const auto* swapped = adamw->swapped_moments())
        counts.disk_wait_us += static_cast<int64_t>(swapped->wait_ms() * 1000.0);
    }
    return counts;
  }
  // metrics.jsonl's "offload": per tier in use, what this step moved and waited (rank 0's).
  nlohmann::json offload_record(const OffloadCounts& before) const {
    const OffloadSetting s = OffloadSetting::of(config);
    const bool host = s.activations || s.cpu_offload || s.swap;  // the disk tier's windows are host-tier bytes
    const bool disk = s.disk;
    if (!host && !disk) return nullptr;
    const OffloadCounts step = offload_counts() - before;
    auto mib = [](int64_t bytes) { return bytes / 1048576.0; };
    nlohmann::json record = nlohmann::json::object();
    if (host) {
      record["host"] = {{"to_host_mib", mib(step.to_host_bytes)},
                        {"to_device_mib", mib(step.to_device_bytes)},
                        {"wait_ms", step.host_wait_us / 1000.0},
                        {"held_mib", mib(tiers->host_pool->held_bytes())}};
      // On a GPU the copies run beside compute; what they cost it is the compute stream's wait.
      if (runtime.device == Device::cuda) record["host"]["device_wait_ms"] = step.device_wait_us / 1000.0;
    }
    if (disk)
      record["disk"] = {{"read_mib", mib(step.disk_read_bytes)},
                        {"written_mib", mib(step.disk_written_bytes)},
                        {"wait_ms", step.disk_wait_us / 1000.0}};
    return record;
  }

  // training.optimizer adamw_swap: the AdamW moments go to the host tier, or to this rank's file
  // under offload_dir (which cpu_offload uses for them too), and pass through windows where the
  // update runs (the shards' device).
  void offload_moments() {
    const auto& t = config.training;
    std::shared_ptr<TierStore> store = tiers->disk;
    if (!store)
      store = std::make_shared<HostStore>(tiers->host_pool,
                                          std::make_shared<CopyStream>(fsdp->shard_device(), tiers->stats, tiers->host_pool));
    int64_t largest = 0;
    for (const auto* unit : fsdp->units()) largest = std::max(largest, unit->shard_flat.numel());
    adamw->offload_moments(store, adamw_offload_chunk_numel(t, runtime.device, largest));  // never in memory first
    const auto* swapped = adamw->swapped_moments();
    log(format("AdamW moments %s (%.1f MiB per rank), through %.1f MiB of windows "
               "(chunks of %lld elements)",
               store->describe().c_str(), store->size() / 1048576.0, swapped->window_bytes() / 1048576.0,
               static_cast<long long>(swapped->chunk_numel())));
  }

  // Rank 0 holds training.save for the run (train/save_root_lock.h); when another run holds it,
  // every rank stops here, before anything is written.
  void lock_save_root() {
    const auto& save = config.training.save;
    if (save.empty()) return;
    std::string refused;
    if (is_rank0()) {
      try {
        save_lock = std::make_unique<SaveRootLock>(save);
      } catch (const Error& e) {
        refused = e.what();
      }
    }
    if (comm().any_rank(!refused.empty())) {
      if (!is_rank0()) fail("rank 0 could not lock training.save '", save, "': see its error");
      fail(refused);
    }
    if (save_lock && !save_lock->previous_holder().empty())
      log("training.save: took over the lock of an earlier run that is gone (" + save_lock->previous_holder() + ")");
  }

  std::string describe_data_order() const {
    const auto& sampler = data.sampler;
    const auto& loader = config.data.loader;
    std::string text = "data: " + std::to_string(sampler.options().num_samples) + " samples, global batch " +
                       std::to_string(sampler.global_batch_size()) + ", " +
                       (loader.shuffle ? "shuffled every epoch" : "in dataset order") + ", " +
                       std::to_string(sampler.steps_per_epoch()) + " full steps per epoch" +
                       (loader.drop_last ? " (the rest of each epoch dropped)" : " (batches run on into the next epoch)");
    if (loader.micro_batch_tokens > 0)
      text += ", micro-batches of at most " + std::to_string(loader.micro_batch_tokens) + " tokens" +
              (loader.balance_dp ? " balanced over the data-parallel ranks by predicted FLOPs" : " packed by tokens, not balanced") +
              " (the loss normalized over each global batch)";
    text += loader.num_workers > 0 ? ", " + std::to_string(loader.num_workers) + " loader threads" : ", loaded inline";
    return text;
  }

  // The samples of step `step` (0-based) over all ranks, for a failure's message: their stream
  // positions and the first few samples by what the dataset calls them (a file, a record).
  std::string describe_step_samples(int64_t step) const {
    const auto& sampler = data.sampler;
    const int64_t first = sampler.step_begin(step), count = sampler.global_batch_size();
    std::string text = "stream positions " + std::to_string(first) + "-" + std::to_string(first + count - 1) +
                       " (epoch " + std::to_string(sampler.epoch_of_step(step)) + "; `mmtrain debug collate --step " +
                       std::to_string(step) + "` reads them):";
    constexpr int64_t kShown = 8;
    for (int64_t i = 0; i < std::min(count, kShown); ++i)
      text += (i ? ", " : " ") + data.dataset->describe(sampler.sample_at(first + i));
    if (count > kShown) text += ", and " + std::to_string(count - kShown) + " more";
    return text;
  }

  // This rank's milliseconds per phase of the step just run, indexed by StepPhase, then
  // comm_wait (the time blocked on FSDP's collectives, part of forward and backward).
  std::vector<double> step_phases_ms() {
    const auto ms = phase_timer.take_ms();
    std::vector<double> out(ms.begin(), ms.end());
    out.push_back(fsdp->take_comm_wait_ms());
    return out;
  }
  static nlohmann::json phases_record(const std::vector<double>& ms) {
    nlohmann::json out = nlohmann::json::object();
    for (int p = 0; p < kStepPhases; ++p) out[step_phase_name(static_cast<StepPhase>(p))] = std::round(ms[p] * 10) / 10;
    out["comm_wait"] = std::round(ms[kStepPhases] * 10) / 10;
    return out;
  }

  // A step's memory peaks, the max over ranks (every rank profiles the same steps).
  nlohmann::json memory_record(const MemoryProfile::StepPeaks& peaks) {
    std::vector<double> values = {peaks.live_start_mb, peaks.step_peak_mb};
    for (double v : peaks.phase_peak_mb) values.push_back(v);
    const auto max = comm().all_reduce_max(values);
    nlohmann::json out = {{"live_start_mb", max[0]}, {"step_peak_mb", max[1]}};
    for (int p = 0; p < kStepPhases; ++p)
      out[std::string(step_phase_name(static_cast<StepPhase>(p))) + "_peak_mb"] = max[2 + p];
    return out;
  }

  // training.load, with auto resolved: training.save when it holds a complete checkpoint (its
  // `latest`), else "" (a fresh start). torchrun --max-restarts relaunches then resume by themselves.
  std::string resolve_load() {
    const auto& t = config.training;
    if (t.load != "auto") return t.load;
    if (checkpoint_saved_under(t.save)) {
      log("training.load: auto: resuming from the newest checkpoint under " + t.save);
      return t.save;
    }
    log("training.load: auto: no checkpoint under " + t.save + " yet: starting fresh");
    return {};
  }

  // A fresh run into an output_dir that holds another run's metrics would interleave two curves
  // in one metrics.jsonl: every rank stops, rank 0 saying why.
  void refuse_an_earlier_run() {
    const auto& dir = config.logging.output_dir;
    const auto earlier = is_rank0() ? metrics_on_disk(dir) : MetricsOnDisk{};
    if (!comm().any_rank(earlier.records > 0)) return;
    if (!is_rank0()) fail("rank 0 refused the run (logging.output_dir holds an earlier run): see its error");
    fail("config ", config.source_path, ": logging.output_dir '", dir, "' already holds a run (", earlier.path, ": ",
         earlier.records, " records, iterations ", earlier.first_iteration, "-", earlier.last_iteration,
         "); a new run there would mix two runs in one file: choose another output_dir, remove the old one, or "
         "resume it (training.load: auto with training.save, or a checkpoint path)");
  }

  // A resumed checkpoint at or past train_iters leaves nothing to train. Under training.load:
  // auto that is a finished run started again (a requeued job): say so and exit 0. A checkpoint
  // named explicitly was meant to be trained on: an error, naming both numbers.
  void refuse_a_finished_run(const std::string& load) {
    const auto& t = config.training;
    if (start_step < t.train_iters) return;
    const std::string what = load + " is at iteration " + std::to_string(start_step) + " and training.train_iters is " +
                             std::to_string(t.train_iters);
    if (t.load != "auto")
      fail("config ", config.source_path, ": training.load ", what, ": nothing to train (raise training.train_iters ",
           "to train on from it)");
    log("training.load: auto: " + what + ": this run has finished, nothing to train");
  }

  // A resumed run trains again what came after its checkpoint: those records go.
  void continue_metrics() {
    if (!is_rank0()) return;
    const int64_t dropped = metrics_keep_through(config.logging.output_dir, start_step);
    if (dropped > 0)
      log("metrics.jsonl: dropped " + std::to_string(dropped) + " records after iteration " +
          std::to_string(start_step) + " (the interrupted run's; they are trained again now)");
  }

  void load_weights() {
    const std::string& path = config.model.weights_path();
    const int64_t conversions = load_initial_weights(config, *model, *fsdp);  // pages shards on disk unit by unit
    if (path.empty()) {
      log("no model weights given: random init with seed " + std::to_string(config.training.seed));
    } else {
      std::printf("[mmtrain] rank %d loaded %s (%lld tensors with a converted layout)\n", comm().rank(), path.c_str(),
                  static_cast<long long>(conversions));
    }
  }

  // A new lineage's name: 64 random bits from rank 0, the same on every rank.
  std::string new_lineage() {
    std::random_device random;
    const double high = is_rank0() ? random() : 0, low = is_rank0() ? random() : 0;
    const auto shared = comm().all_reduce_sum(std::vector<double>{high, low});
    char text[32];
    std::snprintf(text, sizeof text, "%08x%08x", static_cast<unsigned>(shared[0]), static_cast<unsigned>(shared[1]));
    return text;
  }

  // A run starting at start_step saves its own line of checkpoints into training.save: complete
  // checkpoints there of a later iteration belong to another branch (a rollback, another run), and
  // this run's saves would interleave with them, be pruned for them or replace one of them. Refused
  // naming them, or, with training.archive_newer_checkpoints, moved aside (never deleted). Under
  // training.load: auto the run continues from `latest`, its root's last commit: a complete
  // checkpoint newer than that is a save killed between its rename and `latest` (or a hand-edited
  // `latest`), moved aside without asking, so that a requeued job restarts by itself.
  void claim_save_root() {
    const auto& t = config.training;
    if (t.save.empty()) return;
    std::string refused;
    if (is_rank0()) {
      const auto newer = checkpoint_newer_than(t.save, start_step);
      const bool uncommitted = t.load == "auto";
      if (!newer.empty() && (uncommitted || t.archive_newer_checkpoints)) {
        const std::string archive = "archived_" + utc_stamp() + (uncommitted ? "_uncommitted_after_" : "_branch_at_") +
                                    checkpoint_dir_name(start_step);
        const std::string dir = checkpoint_archive(t.save, newer, archive);
        log(uncommitted ? "training.load: auto: " + join(newer, ", ") + " newer than `latest` (a save that never "
                              "named them, interrupted before its last step) moved to " + dir +
                              "; continuing from iteration " + std::to_string(start_step)
                        : "training.archive_newer_checkpoints: moved " + join(newer, ", ") + " (newer than iteration " +
                              std::to_string(start_step) + ", another branch) to " + dir);
      } else if (!newer.empty()) {
        refused = "config " + config.source_path + ": training.save '" + t.save + "' holds checkpoints newer than " +
                  "this run's start at iteration " + std::to_string(start_step) + ": " + join(newer, ", ") +
                  "; they are another branch, which this run's saves would mix with, prune for, or replace. Resume "
                  "the newest (training.load: auto), choose another training.save, or set "
                  "training.archive_newer_checkpoints: true to move them aside (never deleted)";
      }
    }
    if (comm().any_rank(!refused.empty())) {
      if (!is_rank0()) fail("rank 0 refused training.save '", t.save, "': see its error");
      fail(refused);
    }
  }

  static std::string utc_stamp() {
    char text[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
    return text;
  }

  // The plan's prediction for this run (train/run_prediction.h), made by rank 0 (which writes the
  // records) at the first step for the longest of kPredictionSamples samples spread over the data
  // set (or, when it cannot say, the first step's tokens per sample); written to
  // <output_dir>/plan.json and said once when the measured peak exceeds it by more than the margin.
  static constexpr int64_t kPredictionSamples = 256;
  void check_against_plan(StepRecord& record) {
    if (!is_rank0()) return;  // its samples' reads and the plan are wanted once, not per rank
    if (!prediction) {
      // Ragged data peaks at its longest sample: the data set's lengths when it can say them.
      const LengthMix mix = read_length_mix(*data.dataset, kPredictionSamples);
      const int64_t first_step_seqlen = record.tokens / std::max<int64_t>(1, record.global_batch_size);
      prediction = predict_run(config, comm().world_size(), runtime.env.local_world_size, *model, mix.seqlens,
                               first_step_seqlen, baseline_rss_mb, comm().device().is_cuda());
      std::ofstream file(config.logging.output_dir + "/plan.json");
      file << prediction->to_json().dump(2) << "\n";
      if (!file) log("warning: cannot write " + config.logging.output_dir + "/plan.json");
    }
    if (prediction->step_time) record.predicted_step_time_ms = prediction->step_time->total_ms;
    record.predicted_peak_rss_mb = prediction->peak_rss_mb;
    record.predicted_peak_device_mb = prediction->peak_device_mb;
    // The peak the plan predicts: RSS on CPU, the caching allocator's allocated bytes on CUDA.
    const char* what = record.peak_device_allocated_mb ? "peak device memory (allocated)" : "peak RSS";
    const double measured = record.peak_device_allocated_mb ? *record.peak_device_allocated_mb : record.peak_rss_mb;
    const std::optional<double> predicted =
        record.peak_device_allocated_mb ? prediction->peak_device_mb : prediction->peak_rss_mb;
    if (predicted && !peak_over_prediction_said && peak_over_prediction(measured, *predicted)) {
      peak_over_prediction_said = true;
      log(format("warning: %s %.0f MB at iteration %lld exceeds the plan's %.0f MB by %.0f %% (margin %.0f %% and "
                 "%.0f MB): the plan misses some of this run's memory (docs/step_time.md)",
                 what, measured, static_cast<long long>(record.iteration), *predicted,
                 100.0 * (measured / *predicted - 1.0), 100.0 * kPredictionMargin, kPredictionFloorMb));
    }
  }

  // Saves the checkpoint of `step` (steps taken). record_step(ms the save held training up) runs
  // once, before the checkpoint can become `latest`: a resume from it starts after that step and
  // never records it again. (An async save commits at a later step boundary.)
  void save(int64_t step, const std::function<void(double stall_ms)>& record_step) {
    const auto began = std::chrono::steady_clock::now();
    auto stalled_so_far = [&] {
      record_step(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
    };
    StateInfo info;
    info.iteration = step;
    info.global_batch_size = data.sampler.global_batch_size();
    info.model_id = config.model.model_id;
    info.config = config_to_json(config);
    info.plan = state_plan_entry(config.parallel.fsdp_plan);
    info.extra["lineage"] = lineage;
    try {
      if (async_saver) {
        if (async_saver->in_flight()) {
          const auto waited_from = std::chrono::steady_clock::now();
          finish_async_save(async_saver->wait());
          const double waited_ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - waited_from).count();
          log(format("training.async_save: iteration %lld waited %.1f ms for the previous save to finish",
                     static_cast<long long>(step), waited_ms));
        }
        const auto staged = state_save_async(*async_saver, config.training.save, comm(), *model, *fsdp, *adamw, info,
                                             config.training.keep_latest_k);
        log(format("checkpoint of iteration %lld staged in %.1f ms (%.1f MiB on rank 0); writing it in the background",
                   static_cast<long long>(step), staged.ms, staged.bytes / 1048576.0));
        stalled_so_far();
      } else {
        const std::string dir =
            state_save(config.training.save, comm(), *model, *fsdp, adamw.get(), info, stalled_so_far);
        CheckpointPruned pruned;
        const int keep = config.training.keep_latest_k;
        if (is_rank0() && keep > 0) pruned = checkpoint_prune(config.training.save, keep, lineage);
        finish_save(dir, pruned);
      }
    } catch (const Error& e) {
      fail(e.what(), " (training.lr of that step: ", schedule.at(step - 1), ")");
    }
  }

  // What a completed save prints: its directory, then the ones keep_latest_k removed, and as
  // warnings what it could not remove (the checkpoint is committed all the same).
  void finish_save(const std::string& dir, const CheckpointPruned& pruned) {
    if (!dir.empty()) log("saved checkpoint " + dir);
    const std::string what = "training.keep_latest_k " + std::to_string(config.training.keep_latest_k);
    for (const auto& name : pruned.removed) log(what + ": removed " + name);
    for (const auto& warning : pruned.warnings) log("warning: " + what + ": " + warning + " (the checkpoint is saved)");
  }
  void finish_async_save(const std::optional<AsyncCheckpointSaver::Completed>& done) {
    if (done) finish_save(done->dir, done->pruned);
  }

  void resume(const std::string& path) {
    StateLoadOptions options;
    options.model_id = config.model.model_id;
    options.global_batch_size = data.sampler.global_batch_size();
    options.load_optimizer = !config.training.no_load_optim;
    options.load_rng = !config.training.no_load_rng;
    options.model_config = config.model.config;
    options.execution_only_keys = config_model_spec(config).execution_only_keys;
    const StateLoaded loaded = state_load(path, comm(), *model, *fsdp, *adamw, options);  // a unit at a time
    if (loaded.model_only) {
      log("initialized from model-only checkpoint " + loaded.dir);
      return;
    }
    start_step = loaded.iteration;
    lineage = loaded.lineage;
    log("resumed from " + loaded.dir + " at iteration " + std::to_string(start_step) + " (saved on " +
        std::to_string(loaded.saved_world_size) + " ranks, now " + std::to_string(comm().world_size()) + ")");
    report_node_changes(loaded.saved_nodes);
  }

  // After an elastic restart: which nodes the run lost or gained since its checkpoint.
  void report_node_changes(const std::vector<std::string>& saved_nodes) {
    const auto nodes = node_names_of_ranks(runtime.store, comm().rank(), comm().world_size());
    if (saved_nodes.empty() || saved_nodes == nodes) return;
    std::string line = "the nodes changed since the checkpoint: it was saved on " + describe_nodes(saved_nodes) +
                       "; this run has " + describe_nodes(nodes);
    if (const auto lost = nodes_missing(saved_nodes, nodes); !lost.empty()) line += "; lost: " + join(lost, ", ");
    if (const auto joined = nodes_missing(nodes, saved_nodes); !joined.empty()) line += "; joined: " + join(joined, ", ");
    log(line + "; global batch " + std::to_string(data.sampler.global_batch_size()) + " kept with gradient accumulation " +
        std::to_string(config.training.gradient_accumulation_steps));
  }

  void train() {
    const auto& t = config.training;
    MetricsLog metrics(config.logging.output_dir, is_rank0(), config.logging.progress, config.logging.tensorboard);
    const int world = comm().world_size();
    const int dp = mesh->dp_size();
    const bool token_budget = data.sampler.token_budget();
    const int64_t end_step = t.exit_interval > 0 ? std::min(t.train_iters, (start_step / t.exit_interval + 1) * t.exit_interval)
                                                 : t.train_iters;
    LoaderOptions loading;
    loading.num_workers = config.data.loader.num_workers;
    loading.prefetch_factor = config.data.loader.prefetch_factor;
    loading.pin_memory = config.data.loader.pin_memory && comm().device().is_cuda();
    DataLoader loader(data, start_step, end_step, loading);
    for (int64_t step = start_step; step < t.train_iters; ++step) {
      const int64_t epoch = data.sampler.epoch_of_step(step);
      if (step > start_step && epoch != data.sampler.epoch_of_step(step - 1))
        log("epoch " + std::to_string(epoch) + " begins at iteration " + std::to_string(step + 1));
      const auto started = std::chrono::steady_clock::now();
      reset_device_memory_peak(comm().device());
      StepSettings settings;
      settings.iteration = step + 1;
      std::optional<StepSplit> split;
      if (token_budget) split = data.sampler.split(step);
      settings.accumulation = static_cast<int>(split ? split->micro_batches_per_rank() : data.sampler.micro_batches(step));
      if (split) {
        // Every rank of a context-parallel group holds the same micro-batches: the sum over all
        // ranks counts each data-parallel rank's world / dp times.
        settings.sum_over_dp = [this, world, dp](const std::vector<double>& counts) {
          auto sums = comm().all_reduce_sum(counts);
          for (double& s : sums) s /= static_cast<double>(world / dp);
          return sums;
        };
        settings.dp = dp;
      }
      settings.lr = schedule.at(step);
      settings.clip_grad = t.clip_grad;
      settings.listeners = {&phase_timer};
      settings.samples = [this, step] { return describe_step_samples(step); };
      const bool memory_step = memory_profile->covers(step + 1);
      if (memory_step) {
        settings.listeners.push_back(memory_profile.get());
        memory_profile->begin_step();
      }
      profiler->begin_step(step + 1);
      const OffloadCounts offload_before = offload_counts();
      const auto stats = train_step(*model, *fsdp, *adamw, finiteness, settings, [&](int micro) {
        auto batch = loader.next(step, micro);
        for (auto& [key, tensor] : batch) tensor = tensor.to(comm().device());
        return batch;
      });
      const bool traced = profiler->tracing();
      profiler->end_step(step + 1);
      const auto phases = step_phases_ms();
      // This rank's compute: forward and backward less their waits on FSDP's collectives.
      const double compute_ms = phases[static_cast<int>(StepPhase::forward)] +
                                phases[static_cast<int>(StepPhase::backward)] - phases[kStepPhases];
      const auto totals =
          comm().all_reduce_sum(std::vector<double>{stats.loss_sum, stats.flops, stats.tokens, compute_ms});
      // [phases..., peak RSS, (on CUDA) allocated peak, reserved peak, heaviest micro-batch,
      // predicted work, compute ms], max over ranks
      std::vector<double> maxed = phases;
      maxed.push_back(peak_rss_mb());
      const std::optional<DeviceMemoryPeak> device_peak = device_memory_peak(comm().device());
      if (device_peak) maxed.insert(maxed.end(), {device_peak->allocated_mb, device_peak->reserved_mb});
      maxed.insert(maxed.end(), {stats.max_micro_batch_flops, stats.flops, compute_ms});
      maxed = comm().all_reduce_max(maxed);
      const double rss_mb = maxed[phases.size()];
      const double max_micro_flops = maxed[maxed.size() - 3], max_flops = maxed[maxed.size() - 2];
      const double max_compute_ms = maxed.back();
      const double step_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();

      StepRecord record;
      record.iteration = step + 1;
      record.global_batch_size = data.sampler.global_batch_size();
      record.consumed_samples = (step + 1) * record.global_batch_size;
      record.epoch = epoch;
      // Per-micro-batch means average over micro-batches and ranks; a global normalization's
      // shares add up (each counted once per context-parallel rank).
      record.loss = token_budget ? totals[0] / (world / dp) : totals[0] / (settings.accumulation * world);
      record.grad_norm = stats.grad_norm;
      record.lr = settings.lr;
      record.step_time_ms = step_ms;
      record.tokens = static_cast<int64_t>(totals[2]);
      record.peak_rss_mb = rss_mb;
      if (device_peak) {
        record.peak_device_allocated_mb = maxed[phases.size() + 1];
        record.peak_device_reserved_mb = maxed[phases.size() + 2];
      }
      record.phases_ms = phases_record(phases);
      record.phases_max_ms = phases_record(maxed);
      // Balance across ranks: the busiest over the mean (1 = even).
      if (totals[1] > 0) {
        const double mean_flops = totals[1] / world;
        record.dp_work_imbalance = max_flops / mean_flops;
        record.dp_work_imbalance_bound = std::max(mean_flops, max_micro_flops) / mean_flops;
      }
      if (totals[3] > 0) record.dp_compute_imbalance = max_compute_ms / (totals[3] / world);
      if (split) {
        record.dp_work_imbalance_bound = split->balance_bound();  // samples, not micro-batches, are what moves
        record.micro_batches = split->micro_batches_per_rank();
        record.budget_fill = split->budget_fill();
        record.samples_skipped = static_cast<int64_t>(split->skipped.size());
        record.global_batch_size -= *record.samples_skipped;
      }
      if (totals[1] > 0) {
        const auto rate = throughput(totals[1], world, step_ms / 1000.0, config.logging.hardware_flops);
        record.tflops_per_device = rate.tflops_per_device;
        if (config.logging.hardware_flops > 0) record.mfu = rate.mfu;
      }
      record.offload = offload_record(offload_before);
      check_against_plan(record);
      record.profiled = traced;
      if (memory_step) record.memory = memory_record(memory_profile->end_step());
      if (!std::isfinite(record.loss)) fail("iteration ", step + 1, ": loss is NaN/Inf: stopping");

      // A background save that finished (or failed) during this step is settled at its boundary.
      if (async_saver) finish_async_save(async_saver->poll());
      const bool exiting = t.exit_interval > 0 && (step + 1) % t.exit_interval == 0;
      const bool last = step + 1 == t.train_iters || exiting;
      const bool logged = (step + 1) % t.log_interval == 0 || step + 1 == t.train_iters;
      auto write_record = [&] {
        if (logged) metrics.record(record, t.train_iters);
      };
      if (!t.save.empty() && (last || (t.save_interval > 0 && (step + 1) % t.save_interval == 0)))
        save(step + 1, [&](double stall_ms) {
          record.checkpoint_stall_ms = stall_ms;
          write_record();
        });
      else
        write_record();
      if (exiting) {
        log("exit_interval " + std::to_string(t.exit_interval) + " reached at iteration " + std::to_string(step + 1));
        break;
      }
    }
    // A normal exit leaves no save behind.
    if (async_saver) finish_async_save(async_saver->wait());
    // The last step's weights had no next grad norm to carry their check.
    if (comm().any_rank(finiteness.non_finite())) {
      if (!finiteness.non_finite()) fail("a weight another rank holds is NaN/Inf after the last step (see its error)");
      fail(finiteness.found(), ": the run ends with non-finite weights (no later step or save wrote them)");
    }
  }
};

Trainer::Trainer(Config config, Runtime runtime) : state_(std::make_unique<State>()) {
  auto& s = *state_;
  s.config = std::move(config);
  s.runtime = std::move(runtime);
  const std::string load = s.resolve_load();
  if (load.empty()) s.refuse_an_earlier_run();  // before anything big is allocated
  s.build();
  s.lineage = s.new_lineage();  // a resume continues the loaded checkpoint's instead
  if (!load.empty()) {
    s.resume(load);
    if (s.start_step == 0) s.refuse_an_earlier_run();  // a model-only checkpoint starts a fresh run
    s.refuse_a_finished_run(load);
  }
  s.claim_save_root();
  if (!load.empty()) {
    s.continue_metrics();
  } else {
    s.load_weights();
  }
}

Trainer::~Trainer() = default;

void Trainer::run() { state_->train(); }

}  // namespace mmtrain
