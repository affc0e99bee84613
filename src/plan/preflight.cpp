#include "plan/preflight.h"

#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "core/text.h"
#include "fsdp/plan.h"
#include "io/user_file.h"
#include "optim/swapped_state.h"
#include "plan/offload_plan.h"
#include "plan/plan_estimate.h"
#include "plan/sampling_plan.h"

#include <sys/statvfs.h>
#include <unistd.h>
#ifdef MMTRAIN_CUDA
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#endif

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace mmtrain {
namespace fs = std::filesystem;
namespace {

std::string gib(int64_t bytes) { return format("%.2f GiB", static_cast<double>(bytes) / (1 << 30)); }

// Creates dir if needed and writes a probe file there as this rank would write its files.
void require_writable_dir(const Config& config, const std::string& key, const std::string& dir, int rank) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error)
    fail("config ", config.source_path, ": ", key, " '", dir, "' cannot be created: ", error.message(),
         " (checked before training, not when it is first written)");
  // A new file under a name of this process's own (host, pid, a random part): two jobs sharing the
  // directory (an offload_dir on one node) probe at once without meeting at one name, and an entry
  // planted in advance (a symlink) is never opened, written or removed: O_EXCL refuses it and the
  // next random name is tried.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::random_device random;
  std::string probe;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    probe = (fs::path(dir) / format(".mmtrain_write_probe_%s_%d_rank%d_%08x", host, static_cast<int>(::getpid()), rank,
                                    static_cast<unsigned>(random())))
                .string();
    fd = create_new_file(probe);
    if (fd < 0 && errno != EEXIST) break;
  }
  const bool written = fd >= 0 && ::write(fd, "probe\n", 6) == 6;
  const int saved_errno = errno;
  if (fd >= 0) {
    ::close(fd);
    fs::remove(probe, error);  // ours: created new just now
  }
  if (!written)
    fail("config ", config.source_path, ": ", key, " '", dir, "' is not writable by rank ", rank, ": ",
         std::strerror(saved_errno), " (checked before training, not when it is first written)");
}

void require_path(const Config& config, const std::string& key, const std::string& path) {
  std::error_code error;
  if (!fs::exists(path, error))
    fail("config ", config.source_path, ": ", key, " '", path, "' does not exist (checked before building the model)");
}

// The first integer after `key` in a /proc-style "key: value kB" file, in bytes.
std::optional<int64_t> meminfo_bytes(const char* key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  int64_t kib = 0;
  std::string unit;
  while (in >> name >> kib >> unit)
    if (name == key) return kib * 1024;
  return std::nullopt;
}

std::optional<int64_t> file_int(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// training.offload_dir must hold every local rank's file (with 5 % to spare).
void require_offload_room(const Config& config, int64_t bytes_per_rank, int local_ranks) {
  const auto& dir = config.training.offload_dir;
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return;  // unknown: the writes will say
  const int64_t free_bytes = static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
  const int64_t needed = bytes_per_rank * local_ranks;
  if (needed + needed / 20 <= free_bytes) return;
  fail("config ", config.source_path, ": training.offload_dir '", dir, "' has ", gib(free_bytes),
       " free, but what goes there (optimizer state, shards, EMA) needs ", gib(bytes_per_rank), " per rank x ", local_ranks,
       " rank(s) on this node = ", gib(needed), " (checked before training; free some room or choose another disk)");
}

}  // namespace

void preflight_paths(const Config& config, int rank) {
  // Checkpoints record the effective config as JSON, which must be UTF-8: a path that is not
  // failed at the first save, after the training.
  try {
    (void)config_to_json(config).dump();
  } catch (const nlohmann::json::exception& e) {
    fail("config ", config.source_path, ": a value is not valid UTF-8 (", e.what(),
         "); checkpoints record the config as JSON, so every path and string must be UTF-8");
  }
  const auto& t = config.training;
  // Resuming from this run's own save root before it holds a checkpoint is what `auto` is for.
  if (!t.load.empty() && t.load != "auto" && !t.save.empty() && fs::path(t.load).lexically_normal() ==
      fs::path(t.save).lexically_normal() && !checkpoint_saved_under(t.save))
    fail("config ", config.source_path, ": training.load '", t.load, "' is this run's training.save, which holds no ",
         "checkpoint yet; use training.load: auto, which resumes when a checkpoint is there and starts fresh when "
         "none is");
  if (!t.load.empty() && t.load != "auto") require_path(config, "training.load", t.load);
  if (t.load.empty() && !config.model.weights_path().empty())
    require_path(config, config.model.checkpoint_path.empty() ? "model.model_name_or_path" : "model.checkpoint_path",
                 config.model.weights_path());
  if (!t.save.empty()) require_writable_dir(config, "training.save", t.save, rank);
  if (!t.offload_dir.empty()) {
    if (!fs::is_directory(t.offload_dir))
      fail("config ", config.source_path, ": training.offload_dir '", t.offload_dir,
           "' is not a directory (it is not created for you: it should be a fast local disk with room for the "
           "moments; checked before training)");
    require_writable_dir(config, "training.offload_dir", t.offload_dir, rank);
  }
  require_writable_dir(config, "logging.output_dir", config.logging.output_dir, rank);
}

int64_t offload_chunk_numel(const TrainingConfig& training, Device device, int64_t largest_shard_numel,
                            int tensors_per_param) {
  return SwappedState::chunk_numel_for(training.mem_fraction_static,
                                       device == Device::cuda ? cuda_free_memory_bytes() : available_memory_bytes(),
                                       largest_shard_numel, tensors_per_param);
}

std::optional<int64_t> available_memory_bytes() {
  std::optional<int64_t> available = meminfo_bytes("MemAvailable:");
  const auto limit = file_int("/sys/fs/cgroup/memory.max");
  const auto current = file_int("/sys/fs/cgroup/memory.current");
  if (limit && current) {
    const int64_t cgroup_free = std::max<int64_t>(0, *limit - *current);
    available = available ? std::min(*available, cgroup_free) : cgroup_free;
  }
  return available;
}

std::optional<int64_t> cuda_free_memory_bytes() {
#ifdef MMTRAIN_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
#else
  return std::nullopt;
#endif
}

namespace {

// The sampling phase's largest forward (training.sample_prompts: the largest prompt's working set
// and what the sampler keeps on the device all phase): it runs between steps, so it is counted
// like the phases around the step, and a prompt too large for the memory is refused now, not
// after the steps before the first sampling iteration.
int64_t sampling_forward_bytes(const Config& config, Module& model, int world) {
  if (config.training.sample_interval <= 0 && !config.training.sample_at_start) return 0;
  const auto estimate = plan_estimate(config, world, /*seqlen=*/0, model);
  const auto sampling = plan_sampling(*estimate, /*profile=*/nullptr, /*devices_per_node=*/1);
  return sampling ? sampling->forward_bytes : 0;
}

// GRPO's rollout likewise, every step, at the model's default sequence length for the prompts
// (the data's lengths are not read here; `mmtrain plan` takes them).
int64_t rollout_forward_bytes(const Config& config, Module& model, int world) {
  if (config.training.objective != "grpo") return 0;
  const auto estimate = plan_estimate(config, world, /*seqlen=*/0, model);
  const auto rollout = plan_rollout(*estimate, /*profile=*/nullptr, /*devices_per_node=*/1);
  return rollout ? rollout->forward_bytes : 0;
}

}  // namespace

void preflight_memory(const Config& config, Module& model, const LaunchEnv& env, Device device, int fsdp_size) {
  auto plan = fsdp_memory_plan(model, config.parallel.fsdp_plan, fsdp_size);
  plan.optimizer_bytes = optimizer_state_bytes(config, model, plan, fsdp_size);
  // The disk tier (the optimizer state, under cpu_offload the fp32 shards, the EMA with
  // ema.offload disk): the disk needs room for every rank of this node's file, whether or not the
  // memory below can be read.
  if (!config.training.offload_dir.empty()) {
    const OffloadSetting on = OffloadSetting::of(config);
    const bool ema_on_disk = config.training.ema.enable && config.training.ema.offload == "disk";
    require_offload_room(config,
                         (on.swap ? plan.optimizer_bytes : 0) + (on.cpu_offload ? plan.param_bytes : 0) +
                             (ema_on_disk ? ema_shadow_bytes(config, plan) : 0),
                         env.local_world_size);
  }
  // On CPU the ranks of a node share its memory; on CUDA each rank has a device of its own.
  const bool cuda = device == Device::cuda;
  // An asynchronous save stages every trained tensor in host RAM: with the disk tier holding them,
  // that is the memory offload_dir exists to free.
  if (config.training.async_save && !config.training.offload_dir.empty()) {
    const PhaseBytes phases = offload_phase_bytes(plan, OffloadSetting::of(config), !cuda, !config.features.enable_lora);
    fail("config ", config.source_path, ": training.async_save: its staging copy would hold this rank's weights and ",
         "moments in host RAM, ", gib(phases.async_save.host), ", which training.offload_dir keeps on disk; a ",
         "synchronous save (async_save: false) holds ", gib(phases.save.host), " beyond the step (one FSDP unit at a time)");
  }
  const auto available = cuda ? cuda_free_memory_bytes() : available_memory_bytes();
  if (!available) return;
  const int sharing = cuda ? 1 : env.local_world_size;
  // The offload features this config turns on move bytes off the device (plan/offload_plan.h);
  // on CPU the host tier is the same RAM, so there only the disk tier takes bytes away.
  OffloadPlanInputs offload_in;
  offload_in.fsdp = &plan;
  const int64_t reference_bytes = reference_copy_bytes(config, fsdp_size);
  offload_in.other_device_bytes = reference_bytes;
  offload_in.ema_bytes = ema_shadow_bytes(config, plan);
  offload_in.ema_offload = config.training.ema.offload;
  offload_in.ema_window_bytes = ema_window_bytes(config, plan, available);
  offload_in.window_bytes = offload_window_bytes(config, plan, available);
  const OffloadSetting setting = OffloadSetting::of(config);
  const TierBytes tiers = offload_tier_bytes(offload_in, setting);
  // Around the step (start-up, the save the config asks for, a resume): the largest of them on
  // top of it, per tier. (An evaluation adds activations only, which this check does not count.)
  PhaseBytes phases = offload_phase_bytes(plan, setting, /*device_is_host=*/!cuda, !config.features.enable_lora);
  phases.sampling.device = sampling_forward_bytes(config, model, env.world_size);
  phases.rollout.device = rollout_forward_bytes(config, model, env.world_size);
  const auto around = config_phases(phases, config);
  const PhasePeak host_peak = largest_phase(around, [](const TierBytes& b) { return b.host; });
  const PhasePeak device_peak =
      largest_phase(around, [cuda](const TierBytes& b) { return cuda ? b.device : b.device + b.host; });
  if (cuda && tiers.host + host_peak.bytes > 0) {  // the host tier is this node's pinned RAM, shared by its ranks
    const auto host_available = available_memory_bytes();
    const int64_t host_needed = (tiers.host + host_peak.bytes) * env.local_world_size;
    if (host_available && host_needed > *host_available)
      fail("config ", config.source_path, ": the host needs ", gib(tiers.host), " per rank for the offload features' ",
           "host tier and ", gib(host_peak.bytes), " more during ", host_peak.name, ", x ", env.local_world_size,
           " rank(s) on this node = ", gib(host_needed), " of host memory, but ", gib(*host_available),
           " are available (MemAvailable / cgroup limit); `mmtrain plan` shows each tier and phase");
  }
  const int64_t step = cuda ? tiers.device : tiers.device + tiers.host;
  const int64_t per_rank = step + device_peak.bytes;
  const int64_t needed = per_rank * sharing;
  if (needed <= *available) return;
  const std::string where = cuda ? "this rank's GPU (cuda:" + std::to_string(env.local_rank) + ")" : "this machine";
  fail("config ", config.source_path, ": the run cannot fit ", where, "'s memory: each rank needs at least ",
       gib(per_rank), " (fp32 shards ", gib(plan.param_bytes), ", grads ", gib(plan.grad_bytes), ", optimizer state ",
       gib(plan.optimizer_bytes), ", gathered units ", gib(plan.transient_bytes()),
       reference_bytes > 0 ? ", the dpo reference copy " + gib(reference_bytes) : std::string(), "; activations not counted",
       setting.name() == "none" ? "" : "; offload " + setting.name() + ": " + gib(step) + " for the step",
       "; ", gib(device_peak.bytes), " more during ", device_peak.name, ")",
       cuda ? "" : format(" x %d rank(s) on this node = %s", sharing, gib(needed).c_str()), ", but ", gib(*available),
       cuda ? " are free on the device (cudaMemGetInfo)" : " are available (MemAvailable / cgroup limit)",
       ". Use more ranks or nodes (FSDP over ", fsdp_size, " now), or a smaller model",
       device_peak.name == "a sampling phase" ? std::string(", or a smaller largest prompt in training.sample_prompts (its "
                                                            "seconds and resolution)")
                                              : std::string(),
       "; `mmtrain plan` shows the whole estimate");
}

}  // namespace mmtrain
