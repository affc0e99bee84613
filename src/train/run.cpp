#include "train/run.h"

#include "core/error.h"
#include "core/text.h"
#include "io/user_file.h"
#include "nn/lora.h"
#include "offload/host_store.h"
#include "optim/adamw8bit.h"
#include "plan/device_profile.h"
#include "plan/offload_plan.h"
#include "plan/preflight.h"
#include "record/metrics.h"
#include "train/build.h"
#include "train/run_save.h"

#include <ATen/Context.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace mmtrain {

void Run::log(const std::string& message) const {
  if (is_rank0()) std::printf("[mmtrain] %s\n", message.c_str());
  std::fflush(stdout);
}

// The copies and the shard pager count themselves (OffloadStats); the disk tier's bytes are its
// store's, and the waits for it of the optimizer state and the EMA shadows on it are theirs.
OffloadCounts Run::offload_counts() const {
  tiers->stats->settle_device_waits();
  OffloadCounts counts = tiers->stats->snapshot();
  if (tiers->disk) {
    counts.disk_read_bytes = tiers->disk->bytes_read();
    counts.disk_written_bytes = tiers->disk->bytes_written();
    auto waited = [&counts](double ms) { counts.disk_wait_us += static_cast<int64_t>(ms * 1000.0); };
    const auto* adamw = dynamic_cast<const AdamW*>(optimizer.get());
    if (const auto* swapped = adamw ? adamw->swapped_moments() : nullptr) waited(swapped->wait_ms());
    if (const auto* adamw8bit = dynamic_cast<const AdamW8bit*>(optimizer.get())) waited(adamw8bit->disk_wait_ms());
    if (const auto* shadows = ema ? ema->swapped() : nullptr; shadows && &shadows->store() == tiers->disk.get())
      waited(shadows->wait_ms());
  }
  return counts;
}

std::shared_ptr<TierStore> Run::swap_store(bool on_disk) const {
  if (on_disk) {
    if (!tiers->disk) fail("the disk tier is not set up (training.offload_dir is empty)");
    return tiers->disk;
  }
  return std::make_shared<HostStore>(tiers->host_pool,
                                     std::make_shared<CopyStream>(fsdp->shard_device(), tiers->stats, tiers->host_pool));
}

std::string Run::describe_data_order() const {
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

std::vector<std::string> Run::texts_to_rank0(const std::string& dir, const std::string& name,
                                             const std::string& text) const {
  const auto part = [&](int rank) { return dir + "/." + name + ".rank" + std::to_string(rank); };
  write_file_no_follow(part(comm().rank()), text, "rank " + std::to_string(comm().rank()) + "'s part of " + name);
  comm().barrier();
  std::vector<std::string> out;
  if (!is_rank0()) return out;
  for (int r = 0; r < comm().world_size(); ++r) {
    out.push_back(read_user_file(part(r), "rank " + std::to_string(r) + "'s part of " + name, int64_t{1} << 30));
    std::filesystem::remove(part(r));
  }
  return out;
}

std::string Run::describe_step_samples(int64_t step) const {
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

namespace {

// training.optimizer adamw_swap: the AdamW moments go to the host tier, or to this rank's file
// under offload_dir (which cpu_offload uses for them too), and pass through windows where the
// update runs (the shards' device).
void offload_moments(Run& run) {
  std::shared_ptr<TierStore> store = run.swap_store(/*on_disk=*/run.tiers->disk != nullptr);
  int64_t largest = 0;
  for (const auto* unit : run.fsdp->units()) largest = std::max(largest, unit->shard_flat.numel());
  // Never in memory first.
  auto& adamw = dynamic_cast<AdamW&>(*run.optimizer);  // adamw_swap, or cpu_offload with a disk: fp32 moments
  adamw.offload_moments(store, offload_chunk_numel(run.config.training, run.runtime.device, largest, 2));
  const auto* swapped = adamw.swapped_moments();
  run.log(format("AdamW moments %s (%.1f MiB per rank), through %.1f MiB of windows "
                 "(chunks of %lld elements)",
                 store->describe().c_str(), store->size() / 1048576.0, swapped->window_bytes() / 1048576.0,
                 static_cast<long long>(swapped->chunk_numel())));
}

// Settings that are valid but do something the user may not have meant, said once at the start.
void warn_quiet_settings(const Run& r) {
  const auto& c = r.config;
  const auto& t = c.training;
  if (c.data.validation_split > 0.0 && t.eval_interval == 0 && !t.eval_at_start)
    r.log(format("warning: data.validation_split %g holds samples out of training, and no evaluation reads them "
                 "(training.eval_interval 0, eval_at_start false): they are only left out", c.data.validation_split));
  if (t.keep_best > 0 && t.keep_latest_k == 0 && !t.save.empty())
    r.log("warning: training.keep_best " + std::to_string(t.keep_best) + " with keep_latest_k 0: every evaluation saves "
          "a full checkpoint and none is ever removed; set keep_latest_k to keep the newest few besides the best");
  if (!c.features.enable_lora) {
    const LoraConfig defaults;
    const nlohmann::json set = lora_adapters(c.features.lora), unset = lora_adapters(defaults);
    std::vector<std::string> given;
    for (const auto& [key, value] : set.items())
      if (unset[key] != value) given.push_back("features.lora." + key);
    if (c.features.lora.init != defaults.init) given.push_back("features.lora.init");
    if (c.features.lora.adapter_dtype != defaults.adapter_dtype) given.push_back("features.lora.adapter_dtype");
    if (!given.empty())
      r.log("warning: " + join(given, ", ") + " set while features.enable_lora is false: the whole model trains, "
            "without adapters (set features.enable_lora: true for LoRA)");
  }
}

}  // namespace

void build_run(Run& r) {
  Comm& comm = r.comm();
  config_resolve_world(r.config, comm.world_size());  // accumulation derived from a pinned global batch
  const auto& c = r.config;
  const ParallelDims dims = config_check_supported(c, comm.world_size());
  // Before any model tensor exists, so that the counting allocator sees all of them.
  if (c.tools.memory_profile.enable && comm.device().is_cuda())
    fail("config ", c.source_path, ": tools.memory_profile counts CPU tensor memory; on CUDA use "
         "tools.profile.with_memory (the caching allocator's events) instead");
  r.memory_profile = std::make_unique<MemoryProfile>(c.tools.memory_profile);
  // Deterministic kernels only (an op without one raises); the CPU kernels and the Gloo sums
  // used here are deterministic anyway, this matters on CUDA.
  if (c.training.use_deter_comp) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  // The process's default generators (CPU, and CUDA's): mmtrain's own randomness takes explicit
  // generators, but a plugin or an op called without one draws from these, and a checkpoint saves
  // their state (cpu_rng_state): a function of training.seed and the rank, never of the process.
  // A resume restores the saved state over it.
  at::manual_seed(c.training.seed * 1000003ULL + static_cast<uint64_t>(comm.rank()));
  preflight_paths(c, comm.rank());
  lock_save_root(r);
  if (c.training.async_save) r.async_saver = std::make_unique<AsyncCheckpointSaver>(comm);
  r.mesh = std::make_unique<DeviceMesh>(build_mesh(dims, r.runtime));
  if (r.mesh->shape().world() > 1) r.log("device mesh " + r.mesh->describe());
  // The data first (a bad path or file fails in seconds), then the model as shapes, checked
  // against the memory there is before its shards are allocated.
  r.data = build_data(c, r.mesh->dp_rank(), r.mesh->dp_size());
  warn_quiet_settings(r);
  if (const auto summary = r.data.dataset->summary(); !summary.empty()) r.log(summary);
  if (!c.logging.device_profile.empty()) load_device_profile(c.logging.device_profile);  // a bad one fails now
  r.baseline_rss_mb = current_rss_mb();
  r.model = build_model(c);
  if (c.features.enable_lora) {
    const int64_t trained = trainable_param_count(*r.model), total = total_param_count(*r.model);
    r.log(format("features.lora: rank %lld, scale %g; trains %lld of %lld parameters (%.2f %%), the base frozen",
                 static_cast<long long>(c.features.lora.rank), c.features.lora.scale(), static_cast<long long>(trained),
                 static_cast<long long>(total), 100.0 * static_cast<double>(trained) / static_cast<double>(total)));
  }
  preflight_memory(c, *r.model, r.runtime.env, r.runtime.device, dims.fsdp());
  r.tiers = OffloadTiers::make(comm.device());
  if (!c.training.offload_dir.empty())  // the disk tier: moments, and with cpu_offload the shards
    r.tiers->disk = std::make_shared<DiskStore>(c.training.offload_dir, comm.rank(), r.tiers->host_pool);
  r.fsdp = parallelize_model(c, *r.model, *r.mesh, r.tiers);
  r.optimizer = make_fsdp_optimizer(*r.fsdp, c.training, r.tiers);
  if (const auto* adamw8bit = dynamic_cast<const AdamW8bit*>(r.optimizer.get()); adamw8bit && adamw8bit->disk())
    r.log(format("8-bit AdamW state %s (%.1f MiB per rank), a unit at a time in RAM (%.1f MiB with the next read ahead)",
                 adamw8bit->disk()->describe().c_str(), adamw8bit->total_state_bytes() / 1048576.0,
                 adamw8bit->state_bytes() / 1048576.0));
  else if (OffloadSetting::of(c).swap)
    offload_moments(r);
  // Its own tiers: the reference's shards never share the model's disk files.
  r.preference_reference = build_preference_reference(c, *r.mesh);
  if (r.preference_reference)
    r.log(format("%s reference: a frozen copy of the initial weights, rank %d holds %.2f MiB of it",
                 c.training.objective.c_str(), comm.rank(), r.preference_reference->fsdp->memory_stats().param_bytes / 1048576.0));
  if (rollout_source_registry().contains(c.training.objective))
    r.rollouts = rollout_source_registry().get(c.training.objective)(r);
  else if (c.training.objective == "grpo")
    fail("training.objective grpo: this build registered no rollout source (src/rl)");
  r.schedule = LrSchedule::make(c.training.lr, c.training.lr_min, c.training.lr_warmup_ratio, c.training.train_iters,
                                c.training.lr_decay_style);
  const std::string trace_dir =
      c.tools.profile.save_path.empty() ? c.logging.output_dir + "/profile" : c.tools.profile.save_path;
  r.profiler = std::make_unique<StepProfiler>(c.tools.profile, comm.rank(), trace_dir, comm.device().is_cuda());
  r.log(r.describe_data_order());
  if (c.data.loader.pin_memory && !comm.device().is_cuda())
    r.log("data.dataloader_param.pin_memory: no effect on " + comm.device().str() + " (batches are not copied)");

  const auto stats = r.fsdp->memory_stats();
  r.log(format("rank %d holds params %.2f MiB, grads %.2f MiB, optimizer state %.2f MiB (full model in param_dtype: "
               "%.2f MiB, %zu FSDP units)",
               comm.rank(), stats.param_bytes / 1048576.0, stats.grad_bytes / 1048576.0,
               r.optimizer->state_bytes() / 1048576.0, stats.unsharded_param_bytes / 1048576.0, r.fsdp->units().size()));
}

}  // namespace mmtrain
