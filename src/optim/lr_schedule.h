// Learning-rate schedules in Megatron's convention (what MindSpeed-MM configs assume): linear
// warmup from 0 over int(lr_warmup_ratio * train_iters) steps, then constant, linear or cosine
// decay from lr to lr_min at train_iters. Step t is the 0-based optimizer step.
#pragma once
#include <cstdint>
#include <string>

namespace mmtrain {

struct LrSchedule {
  double lr = 0.0;
  double lr_min = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  std::string decay_style = "constant";  // constant | linear | cosine

  static LrSchedule make(double lr, double lr_min, double warmup_ratio, int64_t train_iters,
                         const std::string& decay_style);
  double at(int64_t step) const;
};

}  // namespace mmtrain
