// An exponential moving average of the trained weights (training.ema), by diffusers' EMAModel
// rules (training_utils.EMAModel, diffusers 0.3x): each update k = 1, 2, ... (one every
// update_every optimizer steps) moves every shadow weight s toward the weight w,
//   s <- s - (1 - d_k) (s - w)
// with the decay
//   j   = max(0, k - update_after_step - 1)        (d_k = 0 while j = 0: s becomes w)
//   d_k = 1 - (1 + j / inv_gamma)^(-power)          use_ema_warmup
//       = (1 + j) / (10 + j)                        otherwise
//   then clamped to [min_decay, decay].
// The shadows are fp32 flat tensors shaped like the FSDP units' flat shards (each rank averages its
// own rows; padding stays 0), updated after each optimizer step with the same ATen ops as
// EMAModel.step, so they are bitwise diffusers' on the same weights. docs/optimizer.md.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct EmaConfig {
  bool enable = false;
  double decay = 0.9999;           // the ceiling of d_k
  double min_decay = 0.0;          // its floor
  int64_t update_after_step = 0;   // updates (not steps) during which s simply follows w
  bool use_ema_warmup = false;
  double inv_gamma = 1.0;
  double power = 2.0 / 3.0;
  int64_t update_every = 1;        // optimizer steps per update

  static void declare(ConfigSection<EmaConfig>& section);
};

// d_k of update k >= 1 (above).
double ema_decay(const EmaConfig& config, int64_t update);
// The updates done by the end of optimizer step `step` (1-based; 0: none yet).
int64_t ema_updates_by(const EmaConfig& config, int64_t step);

class Ema {
 public:
  // params: the live fp32 flat shards, one per FSDP unit; the shadows start as copies of them.
  Ema(EmaConfig config, std::vector<at::Tensor> params);

  // After optimizer step `step` (1-based): the update, when `step` is one (every update_every).
  void after_step(int64_t step);
  // Shadow i (fp32, shaped like params[i]).
  const at::Tensor& shadow(size_t i) const { return shadows_.at(i); }
  // Exchanges the shadows' values with the weights' (every shard, one at a time): called twice
  // around an evaluation of the EMA weights (training.eval_with_ema), it leaves both as they were.
  void swap_with_params();
  // Overwrites shadow i with a copy of `values` (a checkpoint's), shaped like it.
  void set_shadow(size_t i, const at::Tensor& values);
  size_t size() const { return shadows_.size(); }
  const EmaConfig& config() const { return config_; }
  int64_t state_bytes() const;

 private:
  EmaConfig config_;
  std::vector<at::Tensor> params_, shadows_;
};

}  // namespace mmtrain
