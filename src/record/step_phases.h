// The phases of a training step, as its records name them (metrics.jsonl's phases_ms keys, the
// profiler's mmtrain:: scopes, the memory profile's per-phase peaks), and the listener interface
// through which train/train_step.h reports them to whoever records them.
#pragma once

namespace mmtrain {

// Where a step is: each phase is a profiler scope ("mmtrain::forward", ... in a Kineto trace)
// and is reported to the listeners (the phase timer behind metrics.jsonl's phases_ms; the memory
// profile keeps a peak per phase). data, forward and backward run once per micro-batch; clip is
// the global grad norm and clipping, optimizer the AdamW step.
enum class StepPhase { data, forward, backward, clip, optimizer, finite_check };
// "data", "forward", "backward", "clip", "optimizer", "finite_check" (the one pass over the updated
// weights, train/state_finite.h)
const char* step_phase_name(StepPhase phase);
constexpr int kStepPhases = 6;

class StepPhaseListener {
 public:
  virtual ~StepPhaseListener() = default;
  virtual void phase_begins(StepPhase phase) = 0;
  virtual void phase_ends(StepPhase phase) = 0;
};

}  // namespace mmtrain
