#include "train/trainer.h"

#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "core/text.h"
#include "record/device_memory.h"
#include "record/metrics.h"
#include "train/grpo_objective.h"
#include "train/evaluate.h"
#include "train/run.h"
#include "train/run_save.h"
#include "train/run_start.h"
#include "train/step_report.h"
#include "train/training_sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

namespace mmtrain {

namespace {

// The loader of this run's steps [start_step, end_step): its workers prefetch only what is trained.
// (Its steps are data steps: a GRPO rollout's prompts serve num_iterations optimizer steps.)
std::unique_ptr<DataLoader> open_loader(const Run& run, int64_t end_step) {
  const auto& loader = run.config.data.loader;
  LoaderOptions options;
  options.num_workers = loader.num_workers;
  options.prefetch_factor = loader.prefetch_factor;
  options.pin_memory = loader.pin_memory && run.comm().device().is_cuda();
  const int64_t first = data_step_of(run.config, run.start_step);
  const int64_t end = end_step == run.start_step ? first : data_step_of(run.config, end_step - 1) + 1;
  return std::make_unique<DataLoader>(run.data, first, end, options);
}

// The last step's weights had no next grad norm to carry their check.
void refuse_non_finite_end(Run& run) {
  if (!run.comm().any_rank(run.finiteness.non_finite())) return;
  if (!run.finiteness.non_finite()) fail("a weight another rank holds is NaN/Inf after the last step (see its error)");
  fail(run.finiteness.found(), ": the run ends with non-finite weights (no later step or save wrote them)");
}

}  // namespace

Trainer::Trainer(Config config, Runtime runtime) : run_(start_run(std::move(config), std::move(runtime))) {}

Trainer::~Trainer() = default;

void Trainer::run() {
  Run& run = *run_;
  const auto& t = run.config.training;
  MetricsLog metrics(run.config.logging.output_dir, run.is_rank0(), run.config.logging.progress,
                     run.config.logging.tensorboard);
  PlanWatch plan_watch;
  // training.exit_interval stops the run at the next multiple of it.
  const int64_t end_step = t.exit_interval > 0
                               ? std::min(t.train_iters, (run.start_step / t.exit_interval + 1) * t.exit_interval)
                               : t.train_iters;
  const auto loader = open_loader(run, end_step);
  std::unique_ptr<Evaluator> evaluator;
  if (t.eval_interval > 0 || t.eval_at_start) evaluator = std::make_unique<Evaluator>(run, true);
  // The held-out loss after `iteration` steps, if the config evaluates then. It runs before that
  // step's save, so a checkpoint of an evaluation step carries its loss (training.keep_best) and
  // a resume from it never evaluates it again.
  auto evaluate_if_due = [&](int64_t iteration) -> std::optional<EvalRecord> {
    if (!evaluator || !evaluator->due(iteration)) return std::nullopt;
    EvalRecord eval = evaluator->evaluate(run, iteration);
    if (t.eval_with_ema) {  // the EMA weights in the shards for one more evaluation, then back
      run.ema->swap_with_params();
      eval.ema = evaluator->evaluate(run, iteration).to_json();
      run.ema->swap_with_params();
    }
    const double ranked = t.keep_best_by == "eval_ema_loss" ? eval.ema.at("eval_loss").get<double>() : eval.loss;
    if (!std::isfinite(ranked))
      run.log("warning: iteration " + std::to_string(iteration) + ": the validation loss is NaN/Inf (recorded; it "
              "is never a training.keep_best checkpoint)");
    else if (t.keep_best > 0 && iteration > 0 && !t.save.empty())  // only a checkpoint saved after it is ever best
      run.best = best_checkpoints_update(run.best, iteration, ranked, t.keep_best);
    return eval;
  };
  SamplingPhase sampling(run);
  const bool stop_on_sample_failure = t.sample_failure == "stop";
  if (run.start_step == 0)
    if (const auto eval = evaluate_if_due(0)) metrics.record(*eval);  // eval_at_start: before any step
  // sample_at_start, or a resume's first iteration whose sampling was cut short (it comes after the save).
  if (!sampling.run_if_due(run, metrics, run.start_step) && stop_on_sample_failure)
    fail("training samples after iteration ", run.start_step, " failed (above); training.sample_failure is stop");
  for (int64_t step = run.start_step; step < t.train_iters; ++step) {
    const int64_t iteration = step + 1;
    const auto epoch_of = [&](int64_t s) { return run.data.sampler.epoch_of_step(data_step_of(run.config, s)); };
    if (step > run.start_step && epoch_of(step) != epoch_of(step - 1))
      run.log("epoch " + std::to_string(epoch_of(step)) + " begins at iteration " +
              std::to_string(iteration));
    const StepOutcome outcome = run_step(run, *loader, step);
    StepRecord record = report_step(run, outcome, plan_watch);
    if (!std::isfinite(record.loss)) fail("iteration ", iteration, ": loss is NaN/Inf: stopping");

    // A background save that finished (or failed) during this step is settled at its boundary.
    settle_async_save(run);
    const std::optional<EvalRecord> eval = evaluate_if_due(iteration);
    const bool exiting = t.exit_interval > 0 && iteration % t.exit_interval == 0;
    const bool last = iteration == t.train_iters || exiting;
    const bool logged = iteration % t.log_interval == 0 || iteration == t.train_iters;
    const std::unique_ptr<SampleRecord> rollout_texts = run.rollouts ? run.rollouts->take_texts() : nullptr;
    auto write_records = [&] {
      if (logged) metrics.record(record, t.train_iters);
      if (eval) metrics.record(*eval);
      if (rollout_texts) metrics.record(*rollout_texts);
    };
    const bool save_due = last || (t.save_interval > 0 && iteration % t.save_interval == 0) ||
                          (t.keep_best > 0 && eval.has_value());
    const bool saves = !t.save.empty() && save_due;
    if (saves)
      save_checkpoint(run, iteration, [&](double stall_ms) {
        record.checkpoint_stall_ms = stall_ms;
        write_records();
      });
    else
      write_records();
    // After the save: a failed sampling phase never costs the steps before it.
    if (!sampling.run_if_due(run, metrics, iteration) && stop_on_sample_failure) {
      if (!t.save.empty() && !saves) save_checkpoint(run, iteration, [](double) {});
      finish_async_saves(run);
      fail("training samples after iteration ", iteration, " failed (above); training.sample_failure is stop",
           t.save.empty() ? " (no training.save: nothing was saved)" : ", after saving iteration " + std::to_string(iteration));
    }
    if (exiting) {
      run.log("exit_interval " + std::to_string(t.exit_interval) + " reached at iteration " + std::to_string(iteration));
      break;
    }
  }
  finish_async_saves(run);  // a normal exit leaves no save behind
  refuse_non_finite_end(run);
}

}  // namespace mmtrain
