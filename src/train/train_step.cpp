#include "train/train_step.h"

#include "core/error.h"

#include <cmath>

namespace mmtrain {

ModelOutput forward_backward(Model& model, Fsdp& fsdp, const Batch& batch, double loss_divisor) {
  fsdp.begin_forward();
  auto out = model.forward(batch);
  (loss_divisor == 1.0 ? out.loss : out.loss / loss_divisor).backward();
  fsdp.finish_backward();
  return out;
}

StepStats train_step(Model& model, Fsdp& fsdp, AdamW& adamw, const StepSettings& settings,
                     const std::function<Batch(int micro)>& micro_batch) {
  StepStats stats;
  fsdp.zero_grad();
  for (int m = 0; m < settings.accumulation; ++m) {
    const auto batch = micro_batch(m);
    const auto out = forward_backward(model, fsdp, batch, settings.accumulation);
    stats.loss_sum += out.loss.item<double>();
    stats.flops += model.train_flops(batch);
    stats.tokens += static_cast<double>(out.tokens);
  }
  stats.grad_norm = fsdp.clip_grad_norm(settings.clip_grad);
  if (!std::isfinite(stats.grad_norm))
    fail("iteration ", settings.iteration, ": grad norm is ", stats.grad_norm, " (NaN/Inf): stopping");
  adamw.step(settings.lr);
  return stats;
}

}  // namespace mmtrain
