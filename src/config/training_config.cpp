#include "config/training_config.h"

#include "core/config_schema.h"

namespace mmtrain {

void TrainingConfig::declare(ConfigSection<TrainingConfig>& s) {
  using T = TrainingConfig;
  s.field("micro_batch_size", &T::micro_batch_size)
      .field("gradient_accumulation_steps", &T::gradient_accumulation_steps)
      .field("global_batch_size", &T::global_batch_size)
      .field("seed", &T::seed)
      .field("lr", &T::lr)
      .field("lr_min", &T::lr_min)
      .field("lr_warmup_ratio", &T::lr_warmup_ratio)
      .field("lr_decay_style", &T::lr_decay_style)
      .field("weight_decay", &T::weight_decay)
      .field("adam_beta1", &T::adam_beta1)
      .field("adam_beta2", &T::adam_beta2)
      .field("adam_eps", &T::adam_eps)
      .field("clip_grad", &T::clip_grad)
      .field("train_iters", &T::train_iters)
      .field("optimizer", &T::optimizer)
      .field("min_8bit_size", &T::min_8bit_size)
      .field("mem_fraction_static", &T::mem_fraction_static)
      .field("offload_dir", &T::offload_dir)
      .field("adam_fused", &T::adam_fused)
      .field("init_model_with_meta_device", &T::init_model_with_meta_device)
      .field("load", &T::load)
      .field("no_load_optim", &T::no_load_optim)
      .field("no_load_rng", &T::no_load_rng)
      .field("save", &T::save)
      .field("save_interval", &T::save_interval)
      .field("keep_latest_k", &T::keep_latest_k)
      .field("keep_best", &T::keep_best)
      .field("eval_with_ema", &T::eval_with_ema)
      .field("keep_best_by", &T::keep_best_by)
      .field("archive_newer_checkpoints", &T::archive_newer_checkpoints)
      .field("async_save", &T::async_save)
      .field("log_interval", &T::log_interval)
      .field("exit_interval", &T::exit_interval)
      .field("use_deter_comp", &T::use_deter_comp)
      .field("plugin", &T::plugin)
      .field("eval_interval", &T::eval_interval)
      .field("eval_iters", &T::eval_iters)
      .field("eval_at_start", &T::eval_at_start)
      .field("eval_batch_size", &T::eval_batch_size)
      .field("eval_timesteps", &T::eval_timesteps)
      .field("sample_interval", &T::sample_interval)
      .field("sample_prompts", &T::sample_prompts)
      .field("sample_at_start", &T::sample_at_start)
      .field("sample_vae", &T::sample_vae)
      .field("sample_audio_vae", &T::sample_audio_vae)
      .field("sample_failure", &T::sample_failure)
      .field("objective", &T::objective)
      .section("dpo", &T::dpo, DpoConfig::declare)
      .section("grpo", &T::grpo, GrpoConfig::declare)
      .section("ema", &T::ema, EmaConfig::declare)
      .check([](const T& t, const ConfigCheck& check) {
        const auto number = ConfigCheck::number;
        check.at_least("micro_batch_size", t.micro_batch_size, 1);
        check.at_least("gradient_accumulation_steps", t.gradient_accumulation_steps, 0);
        if (t.global_batch_size < 0)
          check.invalid("global_batch_size", "0 (derived) or a positive integer", std::to_string(t.global_batch_size));
        check.at_least("train_iters", t.train_iters, 0);
        // AdamW moves a weight by about lr per step: far larger values overflow fp32 (1e38 does in
        // the first step), and are typos rather than schedules.
        const std::string lr_cap = "at most " + number(kMaxLearningRate) +
                                   " (AdamW moves a weight by about lr per step; larger values overflow the fp32 "
                                   "weights)";
        if (!(t.lr_min >= 0.0)) check.invalid("lr_min", ">= 0", number(t.lr_min));
        if (t.lr_min > kMaxLearningRate) check.invalid("lr_min", lr_cap, number(t.lr_min));
        if (t.lr > kMaxLearningRate) check.invalid("lr", lr_cap, number(t.lr));
        if (!(t.lr >= t.lr_min)) check.invalid("lr", ">= training.lr_min (" + number(t.lr_min) + ")", number(t.lr));
        check.in_unit("lr_warmup_ratio", t.lr_warmup_ratio, true);
        check.one_of("lr_decay_style", t.lr_decay_style, {"constant", "linear", "cosine"});
        if (!(t.weight_decay >= 0.0)) check.invalid("weight_decay", ">= 0", number(t.weight_decay));
        if (t.lr * t.weight_decay > 1.0)
          check.invalid("weight_decay", "at most 1 / training.lr (" + number(1.0 / t.lr) +
                                            "): the decay multiplies every weight by 1 - lr x weight_decay per step, "
                                            "and below 0 flips and grows them",
                        number(t.weight_decay));
        check.in_unit("adam_beta1", t.adam_beta1, false);
        check.in_unit("adam_beta2", t.adam_beta2, false);
        if (!(t.adam_eps > 0.0)) check.invalid("adam_eps", "> 0", number(t.adam_eps));
        if (!(t.clip_grad >= 0.0)) check.invalid("clip_grad", ">= 0 (0 = no clipping)", number(t.clip_grad));
        check.one_of("optimizer", t.optimizer, {"adamw", "adamw_swap", "adamw8bit"});
        check.at_least("min_8bit_size", t.min_8bit_size, 0);
        check.one_of("objective", t.objective, {"sft", "dpo", "grpo"});
        if (!(t.mem_fraction_static > 0.0 && t.mem_fraction_static <= 1.0))
          check.invalid("mem_fraction_static", "in (0, 1]", number(t.mem_fraction_static));
        check.at_least("save_interval", t.save_interval, 0);
        check.at_least("keep_latest_k", t.keep_latest_k, 0);
        check.at_least("keep_best", t.keep_best, 0);
        check.one_of("keep_best_by", t.keep_best_by, {"eval_loss", "eval_ema_loss"});
        if (t.eval_with_ema && !t.ema.enable)
          check.invalid("eval_with_ema", "false unless training.ema.enable (there are no EMA weights to evaluate)", "true");
        if (t.keep_best_by == "eval_ema_loss" && !t.eval_with_ema)
          check.invalid("keep_best_by", "eval_loss unless training.eval_with_ema (no EMA loss is measured)",
                        "eval_ema_loss");
        if (t.keep_best > 0 && (t.save.empty() || t.eval_interval == 0))
          check.invalid("keep_best", "0 unless training.save and training.eval_interval are set (it keeps the "
                        "checkpoints of the evaluations with the lowest eval_loss)",
                        std::to_string(t.keep_best) + (t.save.empty() ? " without training.save" : " without training.eval_interval"));
        check.at_least("exit_interval", t.exit_interval, 0);
        check.at_least("log_interval", t.log_interval, 1);
        check.at_least("eval_interval", t.eval_interval, 0);
        if (t.eval_iters != -1 && t.eval_iters < 1)
          check.invalid("eval_iters", "a number of global batches >= 1, or -1 (one full pass over the validation set)",
                        std::to_string(t.eval_iters));
        check.at_least("eval_batch_size", t.eval_batch_size, 0);
        check.at_least("sample_interval", t.sample_interval, 0);
        const bool sampling = t.sample_interval > 0 || t.sample_at_start;
        if (sampling && t.sample_prompts.empty())
          check.invalid("sample_prompts", "a prompts file when training.sample_interval or sample_at_start is set", "\"\"");
        if (t.sample_vae.empty() != t.sample_audio_vae.empty())
          check.invalid(t.sample_vae.empty() ? "sample_vae" : "sample_audio_vae",
                        "set together with the other (both decoders decode a sample)", "only one of them set");
        if (!sampling && !t.sample_vae.empty())
          check.invalid("sample_vae", "empty unless training.sample_interval or sample_at_start is set", t.sample_vae);
        if (!sampling && !t.sample_prompts.empty())
          check.invalid("sample_prompts", "empty unless training.sample_interval or sample_at_start is set (nothing would "
                        "sample them)", t.sample_prompts);
        check.one_of("sample_failure", t.sample_failure, {"continue", "stop"});
        if (t.eval_timesteps.empty()) check.invalid("eval_timesteps", "at least one quantile in (0, 1)", "[]");
        for (size_t i = 0; i < t.eval_timesteps.size(); ++i) {
          const double q = t.eval_timesteps[i];
          if (!(q > 0.0 && q < 1.0))
            check.invalid("eval_timesteps", "quantiles in (0, 1) of the training timestep distribution", number(q));
          if (i > 0 && !(q > t.eval_timesteps[i - 1]))
            check.invalid("eval_timesteps", "increasing quantiles without duplicates", number(q) + " after " +
                                                                                        number(t.eval_timesteps[i - 1]));
        }
        if (t.async_save && t.save.empty()) check.invalid("async_save", "false when training.save is not set", "true");
        if (t.load == "auto" && t.save.empty())
          check.invalid("load", "a checkpoint path, or auto together with training.save (auto resumes from it)",
                        "auto without training.save");
      });
}

}  // namespace mmtrain
