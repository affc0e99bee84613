#include "record/step_phases.h"

namespace mmtrain {

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::data: return "data";
    case StepPhase::forward: return "forward";
    case StepPhase::backward: return "backward";
    case StepPhase::clip: return "clip";
    case StepPhase::optimizer: return "optimizer";
    case StepPhase::finite_check: return "finite_check";
  }
  return "?";
}

}  // namespace mmtrain
