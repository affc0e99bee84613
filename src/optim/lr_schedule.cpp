#include "optim/lr_schedule.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace mmtrain {

LrSchedule LrSchedule::make(double lr, double lr_min, double warmup_ratio, int64_t train_iters,
                            const std::string& decay_style) {
  if (decay_style != "constant" && decay_style != "linear" && decay_style != "cosine")
    fail("lr_decay_style: expected constant, linear or cosine, found '", decay_style, "'");
  LrSchedule s;
  s.lr = lr;
  s.lr_min = lr_min;
  s.warmup_steps = static_cast<int64_t>(warmup_ratio * static_cast<double>(train_iters));
  s.total_steps = train_iters;
  s.decay_style = decay_style;
  return s;
}

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step <= warmup_steps)
    return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (decay_style == "constant") return lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double ratio = std::clamp(static_cast<double>(step - warmup_steps) / decay_steps, 0.0, 1.0);
  const double coeff = decay_style == "linear" ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return lr_min + coeff * (lr - lr_min);
}

}  // namespace mmtrain
