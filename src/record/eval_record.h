// EvalRecord: what one evaluation on the held-out set reports (train/evaluate.h), the one
// declaration of its metrics.jsonl keys. A line of its own kind beside the step records:
//   {"kind": "eval", "iteration": N, "eval_loss": ..., "eval_time_ms": ..., ...}
// where iteration is the step it follows (0: before the first step). `mmtrain logs` reads the
// key names here; docs/tools.md explains each.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

inline constexpr const char* kEvalRecordKind = "eval";

struct EvalRecord {
  int64_t iteration = 0;      // the optimizer steps taken when it ran
  double loss = 0;            // eval_loss: the held-out loss (a diffusion model: mean over timesteps)
  // eval_loss_<term> of a model of several loss terms (a video and an audio term), each over
  // the timesteps' mean; empty for one term.
  std::vector<std::pair<std::string, double>> terms;
  // eval_loss_t<q> of a diffusion model: the loss at the timestep of quantile q; empty otherwise.
  std::vector<std::pair<std::string, double>> timesteps;
  std::vector<double> sigmas;  // eval_sigmas: the timestep each quantile is (same order)
  std::optional<double> ppl;  // eval_ppl of a language model: exp(min(20, eval_loss))
  int64_t supervised = 0;     // eval_tokens (language model: supervised tokens) or supervised elements
  int64_t samples = 0;        // eval_samples: held-out samples read (each at every timestep)
  double time_ms = 0;         // eval_time_ms
  // A preference objective's metrics over the held-out pairs under TRL's names (train/objective.h),
  // written with TRL's eval_ prefix: eval_rewards/accuracies, ...
  nlohmann::json objective;
  // training.eval_with_ema: the same evaluation at the EMA weights (its to_json()), written with
  // its eval_ keys as eval_ema_ (eval_ema_loss, ...); null otherwise.
  nlohmann::json ema;

  nlohmann::json to_json() const;
};

}  // namespace mmtrain
