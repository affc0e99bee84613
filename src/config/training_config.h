// TrainingConfig: the `training` section: batch sizes, the optimizer and its schedule, the
// checkpoint cadence and resume switches of the trainer.
#pragma once
#include "nn/preference_loss.h"
#include "nn/grpo_loss.h"
#include "optim/ema.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

template <typename S>
class ConfigSection;

// The largest training.lr / lr_min accepted: AdamW moves a weight by about lr per step.
constexpr double kMaxLearningRate = 1e3;

struct TrainingConfig {
  int micro_batch_size = 1;                    // samples per rank per forward
  int gradient_accumulation_steps = 0;         // micro-batches per optimizer step; 0 = derived (config.h)
  int global_batch_size = 0;                   // samples per step; set, it is kept on any world size (config.h)
  uint64_t seed = 42;
  double lr = 1e-5;                            // peak learning rate, at most kMaxLearningRate
  double lr_min = 0.0;                         // floor of the decay
  double lr_warmup_ratio = 0.0;                // fraction of train_iters with linear warm-up
  std::string lr_decay_style = "constant";     // constant|linear|cosine
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 0.0;                      // max global grad norm; 0 = no clipping
  int64_t train_iters = 0;                     // optimizer steps
  std::string optimizer = "adamw";             // adamw | adamw_swap (moments in the host tier, or on disk with offload_dir)
                                               // | adamw8bit (bitsandbytes' blockwise 8-bit moments, on disk with
                                               // offload_dir; muon: not implemented)
  int64_t min_8bit_size = 4096;                // adamw8bit: params with fewer elements keep fp32 moments (bitsandbytes' default)
  double mem_fraction_static = 0.8;            // adamw_swap: share of the device's free memory its windows may take
  std::string offload_dir;                     // the disk tier: each rank's file of optimizer state (adamw_swap, adamw8bit),
                                               // of shards (cpu_offload) and of the EMA (ema.offload disk)
  bool adam_fused = false;                     // ATen's fused AdamW kernel (not implemented: refused)
  bool init_model_with_meta_device = false;    // mmtrain always builds shapes only and loads each rank's rows
  std::string load;                            // checkpoint dir or save root to resume from; empty = none;
                                               // "auto": training.save's newest checkpoint if any, else fresh
  bool no_load_optim = false;                  // resume weights but not optimizer state
  bool no_load_rng = false;                    // resume without restoring RNG state
  std::string save;                            // save root; empty = never save
  int64_t save_interval = 0;                   // 0 = only at the end (when save is set)
  int keep_latest_k = 0;                       // complete checkpoints of this run's lineage kept under save (the newest k); 0 = all
  bool eval_with_ema = false;                  // training.ema: each evaluation also at the EMA weights (eval_ema_*)
  std::string keep_best_by = "eval_loss";      // eval_loss | eval_ema_loss: what keep_best ranks by
  int keep_best = 0;                           // also keep the N checkpoints of lowest eval_loss (a save at each
                                               // evaluation; checkpoint/best_checkpoints.h); 0 = off
  bool archive_newer_checkpoints = false;      // a run starting at iteration i in a save holding newer checkpoints
                                               // moves them to save/archived_<time>_branch_at_iter_<i>/ (else it is refused)
  bool async_save = false;                     // write checkpoints in the background (checkpoint/async_checkpoint.h)
  int64_t log_interval = 1;                    // iterations between metric lines
  int64_t exit_interval = 0;                   // stop (after saving) once iteration % this == 0; 0 = never
  bool use_deter_comp = false;                 // deterministic kernels only
  std::vector<std::string> plugin;             // seed plugin paths: each must name a built-in model or dataset
  // Held-out evaluation (train/evaluate.h; data.validation or data.validation_split):
  int64_t eval_interval = 0;                   // evaluate after every N steps; 0 = never (Megatron --eval-interval)
  int64_t eval_iters = -1;                     // global batches per evaluation; -1 = one full pass (Megatron --eval-iters)
  bool eval_at_start = false;                  // also evaluate before the first step
  int eval_batch_size = 0;                     // samples per rank per micro-batch; 0 = micro_batch_size
  // A diffusion model's fixed timesteps, as quantiles of the training distribution (sorted, in (0, 1)).
  std::vector<double> eval_timesteps = {0.1, 0.3, 0.5, 0.7, 0.9};
  // Samples during training (train/training_sampler.h): what the model makes from fixed prompts and
  // seeds, written to <output_dir>/samples/iter_N/ (docs/sampling.md).
  int64_t sample_interval = 0;                 // sample after every N steps; 0 = never
  std::string sample_prompts;                  // the prompts file, in `mmtrain sample`'s format for the model
  bool sample_at_start = false;                // also sample before the first step
  std::string sample_vae, sample_audio_vae;    // a video model's decoders: samples to mp4, TensorBoard frames and audio
  std::string sample_failure = "continue";     // a sampling phase that fails: continue (logged, recorded) | stop
  // What a step minimizes (train/objective.h): sft (the model's loss) | dpo (preference pairs,
  // the dpo section: nn/preference_loss.h; docs/preference.md).
  std::string objective = "sft";
  DpoConfig dpo;
  GrpoConfig grpo;  // objective grpo (nn/grpo_loss.h; docs/grpo.md)
  // An exponential moving average of the trained weights, saved with each checkpoint and
  // exported with `convert ... ckpt-to-hf --ema` (optim/ema.h; docs/optimizer.md).
  EmaConfig ema;

  static void declare(ConfigSection<TrainingConfig>& section);
};

}  // namespace mmtrain
