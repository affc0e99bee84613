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
  return out;
}

}  // namespace mmtrain
