// FsdpConfig: the `parallel.fsdp_plan` section, which is also the options struct of the FSDP
// engine (fsdp/fully_shard.h) and of the memory planner (fsdp/plan.h): one struct, no copies.
#pragma once
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct FsdpConfig {
  std::vector<std::string> apply_modules;      // module patterns, e.g. "dit.block.layers.{*}"; order matters
  std::vector<std::string> ignored_modules;    // module patterns whose parameters stay unsharded (not implemented)
  at::ScalarType param_dtype = at::kFloat;     // dtype of the gathered params used in compute
  at::ScalarType reduce_dtype = at::kFloat;    // dtype of the gradient reduce-scatter
  bool reshard_after_forward = true;           // free unsharded params after forward (re-gather in backward)
  int num_to_forward_prefetch = 1;             // units all-gathered ahead in forward
  int num_to_backward_prefetch = 1;            // units all-gathered ahead in backward
  bool cpu_offload = false;                    // shards, grads and optimizer step in the host tier (docs/offload.md)

  static void declare(ConfigSection<FsdpConfig>& section);
};

}  // namespace mmtrain
