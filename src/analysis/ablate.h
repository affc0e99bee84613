// `mmtrain ablate`: the seeds' feature-ablation table. The control run (the config as given) and
// one run per feature (the config plus that feature's overrides) train the same steps on the same
// data and seed; each feature is judged against the control by
//   loss        sum_i |loss_f(i) - loss_c(i)| / sum_i |loss_c(i)| over the common iterations
//   allocated   the peak of tensor memory in use (tools.memory_profile's step_peak_mb, max over
//               ranks) of the most demanding step after the warm-up; change in % of the
//               control's. Communication timing (which prefetches, reduce-scatters and Gloo
//               temporaries overlap) moves a step's peak down from that worst case by a few %,
//               differently in every run; most steps reach the worst case, so the largest is the
//               stable figure, and the one to provision for (the least is reported too, as
//               allocated_least_mb).
//   RSS         the process's peak resident memory (peak_rss_mb of the last record; the analogue
//               of the caching allocator's reserved memory), change in %
//   step time   the median step time after the warm-up, change in % of the control's: the
//               mean of the medians of the control and its repeats
// Repeats of the control (--control-repeats N, spread between the features and one last, so that
// they span the machine's drift over the whole ablation) set the noise floor: a difference no
// larger than the floor is "inside the noise".
//   loss             the largest loss difference of a repeat (0 where the runs are deterministic)
//   allocated        max(|a repeat's change|, 1 MiB), as a % of the control
//   step time        a 95 % prediction interval for one more run's median from the n control runs'
//                    medians, t(0.975, n - 1) * sd * sqrt(1 + 1 / n), at least 2 standard errors of
//                    the difference of two medians of the control's steps (2 * 1.2533 * sd_steps *
//                    sqrt(2 / steps)), in %: a feature that changes nothing lands outside it about
//                    1 time in 20, whatever the machine's run-to-run noise
//   RSS              reported, not judged: identical CPU runs differ by several % (malloc arenas)
#pragma once
#include "analysis/logs.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

// --feature NAME:KEY=VALUE[,KEY=VALUE...], e.g. "no_recompute:features.recompute=false".
struct AblationFeature {
  std::string name;
  std::vector<std::string> overrides;  // "KEY=VALUE", applied after the common --set overrides
};
AblationFeature parse_ablation_feature(const std::string& argument);

// One finished run of the ablation.
struct AblationArm {
  std::string name;
  std::vector<std::string> overrides;
  std::vector<LogRecord> records;  // its metrics.jsonl
};

// The table as JSON: {"steps", "skip", "control": {...}, "control_repeats": [rows like a
// feature's] (with repeats), "noise": {...} (nulls without a repeat),
// "features": [{"name", "overrides", "loss_rel_diff", "allocated_peak_mb", "allocated_change_pct",
// "allocated_least_mb", "rss_peak_mb", "rss_change_pct", "step_time_ms", "step_time_change_pct",
// "inside_noise": {per measure: true, false, or null without a repeat}}]}.
// skip: warm-up iterations left out of the memory peak and the step times.
// controls: the control, then its repeats (none: nothing is judged).
nlohmann::ordered_json ablation_table(const std::vector<AblationArm>& controls, const std::vector<AblationArm>& features,
                                      int64_t skip);
// The table as markdown, one row per feature, each difference marked inside / outside the noise.
std::string ablation_markdown(const nlohmann::ordered_json& table);
// The figure spec for python/mmtrain_py/plots/figures.py (three bar panels with the noise bands).
nlohmann::json ablation_figure(const nlohmann::ordered_json& table, const std::string& title);

}  // namespace mmtrain
