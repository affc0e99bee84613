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
//
// Where they live (training.ema.offload): beside the shards (none), or in a tier of their own, host
// memory or the disk (optim/swapped_state.h), streamed a chunk at a time past the shards for each
// update: elementwise ops, so a chunk's values are the in-memory update's, bitwise. Shards that
// are on disk themselves (cpu_offload with offload_dir) come in a unit at a time through the
// residency callbacks, for the update as for the copy at the start.
#pragma once
#include "offload/tier_store.h"
#include "optim/swapped_state.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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
  std::string offload = "none";    // none (beside the shards) | host | disk (training.offload_dir)

  static void declare(ConfigSection<EmaConfig>& section);
};

// d_k of update k >= 1 (above).
double ema_decay(const EmaConfig& config, int64_t update);
// The updates done by the end of optimizer step `step` (1-based; 0: none yet).
int64_t ema_updates_by(const EmaConfig& config, int64_t step);

class Ema {
 public:
  // Shards that are not always in memory: before(i) brings param i in, after(i, changed) lets it
  // go (writing it back when changed). Unset: they are resident.
  struct Residency {
    std::function<void(size_t)> before;
    std::function<void(size_t, bool changed)> after;
  };

  // params: the live fp32 flat shards, one per FSDP unit; the shadows start as copies of them, in
  // `store` when one is given (streamed through windows of chunk_numel elements; never in memory
  // whole), else beside them.
  Ema(EmaConfig config, std::vector<at::Tensor> params, std::shared_ptr<TierStore> store = nullptr,
      int64_t chunk_numel = 0, Residency residency = {});

  // After optimizer step `step` (1-based): the update, when `step` is one (every update_every).
  void after_step(int64_t step);
  // Elements [begin, begin + numel) of shadow i (fp32, laid out like params[i]): a view of the live
  // shadow, or, offloaded, a host copy read from its tier (never a device window).
  at::Tensor shadow_range(size_t i, int64_t begin, int64_t numel) const;
  // Exchanges the shadows' values with the weights' (every shard, one at a time): called twice
  // around an evaluation of the EMA weights (training.eval_with_ema), it leaves both as they were.
  void swap_with_params();
  // Overwrites shadow i with a copy of `values` (a checkpoint's), shaped like it.
  void set_shadow(size_t i, const at::Tensor& values);
  size_t size() const { return params_.size(); }
  const EmaConfig& config() const { return config_; }
  // Memory the shadows hold beside the shards: all of them, or offloaded the windows.
  int64_t state_bytes() const;
  const SwappedState* swapped() const { return swapped_.get(); }

 private:
  // Calls fn(i, shadow, param) over every shadow and its param, chunk by chunk when offloaded
  // (the two 1-D, on the params' device), the params brought in around it; `changes_params`: fn
  // writes the params (they go back written).
  void for_each_chunk(bool changes_params, const std::function<void(size_t, at::Tensor&, const at::Tensor&)>& fn);

  EmaConfig config_;
  std::vector<at::Tensor> params_, shadows_;  // shadows_: empty when offloaded
  std::unique_ptr<SwappedState> swapped_;     // offloaded: one tensor per param
  Residency residency_;
};

}  // namespace mmtrain
