#include "train/step_report.h"

#include "core/error.h"
#include "core/text.h"
#include "io/user_file.h"
#include "models/flops_report.h"
#include "nn/lora.h"
#include "plan/length_mix.h"
#include "plan/offload_plan.h"
#include "record/device_memory.h"
#include "record/metrics.h"
#include "train/grpo_objective.h"
#include "train/objective.h"

#include <algorithm>
#include <cmath>

namespace mmtrain {

StepOutcome run_step(Run& run, DataLoader& loader, int64_t step) {
  const int world = run.comm().world_size();
  const int dp = run.mesh->dp_size();
  StepOutcome out;
  out.step = step;
  const int64_t data_step = data_step_of(run.config, step);  // a GRPO rollout serves num_iterations steps
  out.epoch = run.data.sampler.epoch_of_step(data_step);
  out.started = std::chrono::steady_clock::now();
  reset_device_memory_peak(run.comm().device());
  StepSettings settings;
  settings.iteration = step + 1;
  if (run.data.sampler.token_budget()) out.split = run.data.sampler.split(step);
  // GRPO: the step's rollout (made now at the first of its num_iterations steps); its micro-batches
  // are the rollout's, one per micro-batch of prompts.
  const std::vector<Batch>* rollout = run.rollouts ? &run.rollouts->batches_for(run, loader, step) : nullptr;
  out.accumulation =
      static_cast<int>(out.split ? out.split->micro_batches_per_rank() : run.data.sampler.micro_batches(data_step));
  settings.accumulation = out.accumulation;
  if (out.split) {
    // Every rank of a context-parallel group holds the same micro-batches: the sum over all
    // ranks counts each data-parallel rank's world / dp times.
    settings.sum_over_dp = [&run, world, dp](const std::vector<double>& counts) {
      auto sums = run.comm().all_reduce_sum(counts);
      for (double& s : sums) s /= static_cast<double>(world / dp);
      return sums;
    };
    settings.dp = dp;
  }
  out.lr = settings.lr = run.schedule.at(step);
  settings.clip_grad = run.config.training.clip_grad;
  settings.objective = objective_forward(run.config, run.preference_reference);
  settings.ema = run.ema.get();
  settings.listeners = {&run.phase_timer};
  settings.samples = [&run, data_step] { return run.describe_step_samples(data_step); };
  out.memory_profiled = run.memory_profile->covers(step + 1);
  if (out.memory_profiled) {
    settings.listeners.push_back(run.memory_profile.get());
    run.memory_profile->begin_step();
  }
  run.profiler->begin_step(step + 1);
  out.offload_before = run.offload_counts();
  out.stats = train_step(*run.model, *run.fsdp, *run.optimizer, run.finiteness, settings, [&](int micro) {
    auto batch = rollout ? rollout->at(static_cast<size_t>(micro)) : loader.next(step, micro);
    for (auto& [key, tensor] : batch) tensor = tensor.to(run.comm().device());
    return batch;
  });
  out.traced = run.profiler->tracing();
  run.profiler->end_step(step + 1);
  // This rank's milliseconds per phase, then comm_wait (the time blocked on FSDP's collectives,
  // part of forward and backward).
  const auto ms = run.phase_timer.take_ms();
  out.phases_ms.assign(ms.begin(), ms.end());
  out.phases_ms.push_back(run.fsdp->take_comm_wait_ms());
  out.gathered_bytes = run.fsdp->take_gathered_bytes();
  if (run.rollouts) out.rollout = run.rollouts->step_metrics();
  return out;
}

void PlanWatch::check(const Run& run, StepRecord& record) {
  if (!run.is_rank0()) return;  // its samples' reads and the plan are wanted once, not per rank
  const Config& config = run.config;
  if (!asked_) {
    asked_ = true;
    record.trainable_params = trainable_param_count(*run.model);
    record.total_params = total_param_count(*run.model);
    // Ragged data peaks at its longest sample: the data set's lengths when it can say them.
    const LengthMix mix = read_length_mix(*run.data.dataset, kPredictionSamples);
    const int64_t first_step_seqlen = record.tokens / std::max<int64_t>(1, record.global_batch_size);
    try {
      prediction_ = predict_run(config, run.comm().world_size(), run.runtime.env.local_world_size, *run.model,
                                mix.seqlens, first_step_seqlen, run.baseline_rss_mb, run.comm().device().is_cuda());
    } catch (const Error& e) {  // the run goes on: the plan is advice
      run.log(std::string("warning: the plan cannot predict this run: ") + e.what());
      return;
    }
    const std::string path = config.logging.output_dir + "/plan.json";
    try {
      write_file_no_follow(path, prediction_->to_json().dump(2) + "\n", "plan.json");
    } catch (const Error& e) {
      run.log(std::string("warning: ") + e.what());
    }
  }
  if (!prediction_) return;
  if (prediction_->step_time) record.predicted_step_time_ms = prediction_->step_time->total_ms;
  record.predicted_peak_rss_mb = prediction_->peak_rss_mb;
  record.predicted_peak_device_mb = prediction_->peak_device_mb;
  // The peak the plan predicts: RSS on CPU, the caching allocator's allocated bytes on CUDA.
  const char* what = record.peak_device_allocated_mb ? "peak device memory (allocated)" : "peak RSS";
  const double measured = record.peak_device_allocated_mb ? *record.peak_device_allocated_mb : record.peak_rss_mb;
  const std::optional<double> predicted =
      record.peak_device_allocated_mb ? prediction_->peak_device_mb : prediction_->peak_rss_mb;
  if (predicted && !peak_over_prediction_said_ && peak_over_prediction(measured, *predicted)) {
    peak_over_prediction_said_ = true;
    run.log(format("warning: %s %.0f MB at iteration %lld exceeds the plan's %.0f MB by %.0f %% (margin %.0f %% and "
                   "%.0f MB): the plan misses some of this run's memory (docs/step_time.md)",
                   what, measured, static_cast<long long>(record.iteration), *predicted,
                   100.0 * (measured / *predicted - 1.0), 100.0 * kPredictionMargin, kPredictionFloorMb));
  }
}

namespace {

nlohmann::json phases_record(const std::vector<double>& ms) {
  nlohmann::json out = nlohmann::json::object();
  for (int p = 0; p < kStepPhases; ++p) out[step_phase_name(static_cast<StepPhase>(p))] = std::round(ms[p] * 10) / 10;
  out["comm_wait"] = std::round(ms[kStepPhases] * 10) / 10;
  return out;
}

// A step's memory peaks, the max over ranks (every rank profiles the same steps).
nlohmann::json memory_record(const Run& run, const MemoryProfile::StepPeaks& peaks) {
  std::vector<double> values = {peaks.live_start_mb, peaks.step_peak_mb};
  for (double v : peaks.phase_peak_mb) values.push_back(v);
  const auto max = run.comm().all_reduce_max(values);
  nlohmann::json out = {{"live_start_mb", max[0]}, {"step_peak_mb", max[1]}};
  for (int p = 0; p < kStepPhases; ++p)
    out[std::string(step_phase_name(static_cast<StepPhase>(p))) + "_peak_mb"] = max[2 + p];
  return out;
}

// metrics.jsonl's "offload": per tier in use, what this step moved and waited (rank 0's).
nlohmann::json offload_record(const Run& run, const OffloadCounts& before) {
  const OffloadSetting s = OffloadSetting::of(run.config);
  const bool host = s.activations || s.cpu_offload || s.swap;  // the disk tier's windows are host-tier bytes
  const bool disk = s.disk;
  if (!host && !disk) return nullptr;
  const OffloadCounts step = run.offload_counts() - before;
  auto mib = [](int64_t bytes) { return bytes / 1048576.0; };
  nlohmann::json record = nlohmann::json::object();
  if (host) {
    record["host"] = {{"to_host_mib", mib(step.to_host_bytes)},
                      {"to_device_mib", mib(step.to_device_bytes)},
                      {"wait_ms", step.host_wait_us / 1000.0},
                      {"held_mib", mib(run.tiers->host_pool->held_bytes())}};
    // On a GPU the copies run beside compute; what they cost it is the compute stream's wait.
    if (run.runtime.device == Device::cuda) record["host"]["device_wait_ms"] = step.device_wait_us / 1000.0;
  }
  if (disk)
    record["disk"] = {{"read_mib", mib(step.disk_read_bytes)},
                      {"written_mib", mib(step.disk_written_bytes)},
                      {"wait_ms", step.disk_wait_us / 1000.0}};
  return record;
}

}  // namespace

StepRecord report_step(Run& run, const StepOutcome& outcome, PlanWatch& plan_watch) {
  const int world = run.comm().world_size();
  const int dp = run.mesh->dp_size();
  const int64_t step = outcome.step;
  const auto& phases = outcome.phases_ms;
  const auto& stats = outcome.stats;
  // This rank's compute: forward and backward less their waits on FSDP's collectives.
  const double compute_ms = phases[static_cast<int>(StepPhase::forward)] +
                            phases[static_cast<int>(StepPhase::backward)] - phases[kStepPhases];
  const auto totals = run.comm().all_reduce_sum(std::vector<double>{stats.loss_sum, stats.flops, stats.tokens, compute_ms});
  // [phases..., peak RSS, (on CUDA) allocated peak, reserved peak, heaviest micro-batch,
  // predicted work, compute ms], max over ranks
  std::vector<double> maxed = phases;
  maxed.push_back(peak_rss_mb());
  const std::optional<DeviceMemoryPeak> device_peak = device_memory_peak(run.comm().device());
  if (device_peak) maxed.insert(maxed.end(), {device_peak->allocated_mb, device_peak->reserved_mb});
  maxed.insert(maxed.end(), {stats.max_micro_batch_flops, stats.flops, compute_ms});
  maxed = run.comm().all_reduce_max(maxed);
  const double rss_mb = maxed[phases.size()];
  const double max_micro_flops = maxed[maxed.size() - 3], max_flops = maxed[maxed.size() - 2];
  const double max_compute_ms = maxed.back();
  const double step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - outcome.started).count();

  StepRecord record;
  record.iteration = step + 1;
  record.global_batch_size = run.data.sampler.global_batch_size();
  record.consumed_samples = (data_step_of(run.config, step) + 1) * record.global_batch_size;
  record.epoch = outcome.epoch;
  // Per-micro-batch means average over micro-batches and ranks; a global normalization's
  // shares add up (each counted once per context-parallel rank).
  record.loss = outcome.split ? totals[0] / (world / dp) : totals[0] / (outcome.accumulation * world);
  record.grad_norm = stats.grad_norm;
  if (!stats.metric_sums.empty()) {  // the objective's metrics over every rank's pairs
    std::vector<double> sums;
    for (const auto& [key, sum] : stats.metric_sums) sums.push_back(sum);
    sums = run.comm().all_reduce_sum(sums);
    std::map<std::string, double> totals_by_key;
    size_t i = 0;
    for (const auto& [key, sum] : stats.metric_sums) totals_by_key[key] = sums[i++] / (world / dp);
    record.objective = objective_metrics(totals_by_key);
  }
  if (outcome.rollout.is_object())  // GRPO: the rollout's rewards, lengths and times
    for (const auto& [key, value] : outcome.rollout.items()) record.objective[key] = value;
  record.lr = outcome.lr;
  record.step_time_ms = step_ms;
  record.tokens = static_cast<int64_t>(totals[2]);
  record.peak_rss_mb = rss_mb;
  if (device_peak) {
    record.peak_device_allocated_mb = maxed[phases.size() + 1];
    record.peak_device_reserved_mb = maxed[phases.size() + 2];
  }
  record.phases_ms = phases_record(phases);
  record.fsdp_gather_mib = static_cast<double>(outcome.gathered_bytes) / (1024.0 * 1024.0);
  record.phases_max_ms = phases_record(maxed);
  // Balance across ranks: the busiest over the mean (1 = even).
  if (totals[1] > 0) {
    const double mean_flops = totals[1] / world;
    record.dp_work_imbalance = max_flops / mean_flops;
    record.dp_work_imbalance_bound = std::max(mean_flops, max_micro_flops) / mean_flops;
  }
  if (totals[3] > 0) record.dp_compute_imbalance = max_compute_ms / (totals[3] / world);
  if (const auto& split = outcome.split) {
    record.dp_work_imbalance_bound = split->balance_bound();  // samples, not micro-batches, are what moves
    record.micro_batches = split->micro_batches_per_rank();
    record.budget_fill = split->budget_fill();
    record.samples_skipped = static_cast<int64_t>(split->skipped.size());
    record.global_batch_size -= *record.samples_skipped;
  }
  if (totals[1] > 0) {
    const auto rate = throughput(totals[1], world, step_ms / 1000.0, run.config.logging.hardware_flops);
    record.tflops_per_device = rate.tflops_per_device;
    if (run.config.logging.hardware_flops > 0) record.mfu = rate.mfu;
  }
  record.offload = offload_record(run, outcome.offload_before);
  plan_watch.check(run, record);
  record.profiled = outcome.traced;
  if (outcome.memory_profiled) record.memory = memory_record(run, run.memory_profile->end_step());
  return record;
}

}  // namespace mmtrain
