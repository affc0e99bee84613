#include "models/model_plan.h"

namespace mmtrain {

Registry<ModelPlanHooks>& model_plan_registry() {
  static Registry<ModelPlanHooks> registry("model plan");
  return registry;
}

}  // namespace mmtrain
