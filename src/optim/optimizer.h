// What the trainer asks of an optimizer over the FSDP units' flat fp32 shards, whatever it keeps
// per weight: AdamW's fp32 moments (optim/adamw.h) or 8-bit ones (optim/adamw8bit.h). Param i is
// unit i's flat shard; its grad is the unit's flat grad, clipped and reduced before step().
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>

namespace mmtrain {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  virtual void step(double lr) = 0;
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t step) { step_count_ = step; }
  // Memory the state holds where the update runs.
  virtual int64_t state_bytes() const = 0;

  // Called around each param's update (in order, once each) when the params are not always in
  // memory (fsdp cpu_offload with shards on disk): before(i) makes param i resident, after(i)
  // may write it back and let it go. Unset: nothing.
  void set_residency(std::function<void(size_t)> before, std::function<void(size_t)> after) {
    before_update_ = std::move(before);
    after_update_ = std::move(after);
  }

  // With the params leaving memory after their update (set_residency), the first NaN/Inf the last
  // step left in a param, read in its updated chunk while it was in RAM; nothing otherwise (the
  // resident params are read after the step by train/state_finite.h, which owns the question).
  struct NonFiniteWeight {
    size_t param;
    int64_t element;  // in the param's flat shard
  };
  std::optional<NonFiniteWeight> first_non_finite_paged_weight() const { return paged_non_finite_; }

 protected:
  // Paged params only (set_residency): records the first NaN/Inf of elements [begin, ...) of
  // param i's flat shard, `updated` being those elements after their update.
  void check_paged(size_t i, int64_t begin, const at::Tensor& updated);

  std::function<void(size_t)> before_update_, after_update_;  // set_residency
  std::optional<NonFiniteWeight> paged_non_finite_;  // seen by the last step in a paged param
  int64_t step_count_ = 0;
};

}  // namespace mmtrain
