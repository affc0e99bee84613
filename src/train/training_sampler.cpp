#include "train/training_sampler.h"

namespace mmtrain {

Registry<TrainingSamplerFactory>& training_sampler_registry() {
  static Registry<TrainingSamplerFactory> registry("training sampler");
  return registry;
}

}  // namespace mmtrain
