#include "train/rollout_source.h"

namespace mmtrain {

Registry<RolloutSourceFactory>& rollout_source_registry() {
  static Registry<RolloutSourceFactory> registry("rollout source");
  return registry;
}

}  // namespace mmtrain
