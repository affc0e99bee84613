// `mmtrain plan CONFIG --auto --device PROFILE --nodes N --devices-per-node G`: the configuration
// chosen by the system. Every combination of the knobs the seeds tuned by hand
//   FSDP shard group (HSDP replicas the rest), Ulysses and ring degrees (for a model that splits its
//   sequence, at degrees its heads divide), recompute on / off, each
//   offload setting (the disk tier only when the config has training.offload_dir), and the
//   micro-batch (accumulation derived from the config's global batch, which stays pinned)
// that `train` would accept (config_check_supported) is planned (plan/plan_estimate.h: memory per tier, and start-up, save and resume beside the
// step, as the pre-flight counts them) and timed (plan/step_time.h); a candidate whose device,
// host or disk bytes exceed the budget is dropped, the rest ranked by predicted step time. The
// best few are printed with memory per tier and time per component; --out writes the winner as
// `--set` lines, which `train` and `plan` take with --set-file. Nothing fits: an error naming the
// smallest need of each tier against its budget.
#pragma once
#include "planning/plan.h"

namespace mmtrain {

void plan_auto(const PlanOptions& options);

}  // namespace mmtrain
