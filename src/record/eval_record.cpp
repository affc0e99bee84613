#include "record/eval_record.h"

namespace mmtrain {

nlohmann::json EvalRecord::to_json() const {
  nlohmann::json out = {{"kind", kEvalRecordKind}, {"iteration", iteration}, {"eval_loss", loss}};
  for (const auto& [name, value] : terms) out["eval_loss_" + name] = value;
  for (const auto& [name, value] : timesteps) out["eval_loss_" + name] = value;
  if (!sigmas.empty()) out["eval_sigmas"] = sigmas;
  if (ppl) out["eval_ppl"] = *ppl;
  out["eval_tokens"] = supervised;
  out["eval_samples"] = samples;
  out["eval_time_ms"] = time_ms;
  if (objective.is_object())
    for (const auto& [key, value] : objective.items()) out["eval_" + key] = value;
  if (ema.is_object())
    for (const auto& [key, value] : ema.items())
      if (key.rfind("eval_", 0) == 0 && key != "eval_samples" && key != "eval_tokens")
        out["eval_ema_" + key.substr(5)] = value;
  return out;
}

}  // namespace mmtrain
