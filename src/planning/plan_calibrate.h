// `mmtrain plan --calibrate RUN_DIR... --device PROFILE --out FILE`: fits the profile's compute
// efficiencies to measured runs. Each run directory holds the plan's prediction for it
// (plan.json, written by a run with logging.device_profile set to this profile: its step time by
// component) and its metrics (the median step time after --skip-first warm-up iterations). The
// model's step time is compute C (GEMMs, attention, recompute) plus the rest R (exposed
// communication and copies, the optimizer); the fit scales compute, measured ~ k C + R, by least
// squares over the runs, and writes the profile with its GEMM and attention efficiencies divided
// by k (at most 1). R is held as predicted: a first-order fit (exposed communication shrinks
// when compute grows), stated in docs/step_time.md. Prints each run's measured and predicted
// step time before and after, and the median absolute error of each.
#pragma once
#include <string>
#include <vector>

namespace mmtrain {

struct CalibrateOptions {
  std::vector<std::string> runs;  // run output directories
  std::string device;             // the profile they were predicted on
  std::string out;                // the calibrated profile (refused when it exists)
  int skip_first = 2;             // warm-up iterations left out of each run's median
};

void plan_calibrate(const CalibrateOptions& options);

}  // namespace mmtrain
