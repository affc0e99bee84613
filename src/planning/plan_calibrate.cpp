#include "planning/plan_calibrate.h"

#include "analysis/logs.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/statistics.h"
#include "core/text.h"
#include "io/user_file.h"
#include "plan/device_profile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace mmtrain {
namespace {

struct Run {
  std::string dir;
  double measured_ms = 0, compute_ms = 0, rest_ms = 0;  // rest: the prediction's non-compute part
};

// A run's plan.json or a profile: files from elsewhere, parsed depth-checked.
nlohmann::json read_json(const std::string& path, const std::string& what) {
  return json_parse_checked(read_user_file(path, what + ": " + path, kMaxSmallJsonBytes), what + ": " + path);
}

Run read_run(const std::string& dir, const std::string& profile, int skip_first) {
  const std::string where = "plan --calibrate: run " + dir;
  const auto plan_path = dir + "/plan.json";
  if (!std::filesystem::exists(plan_path))
    fail(where, ": no plan.json (a run writes it when logging.device_profile is set)");
  const auto plan = read_json(plan_path, where);
  if (!plan.is_object() || !plan.contains("step_time") || !plan.contains("device_profile"))
    fail(where, ": plan.json has no step time (the run had no logging.device_profile)");
  const std::string predicted_on = json_string(plan, "device_profile", where + ": plan.json");
  if (predicted_on != profile) fail(where, ": it was predicted on profile '", predicted_on, "', not '", profile, "'");
  const auto& t = plan["step_time"];
  const std::string in_step = where + ": plan.json step_time";
  // The fit's inputs: times are finite and not negative, and the whole covers its compute part.
  auto time_ms = [&](const char* key) {
    const double ms = t.is_object() && t.contains(key) ? json_finite(t, key, in_step) : 0.0;
    if (ms < 0) fail(in_step, ": '", key, "' must be >= 0 ms, found ", ms);
    return ms;
  };
  Run run;
  run.dir = dir;
  run.compute_ms = time_ms("gemm_ms") + time_ms("attention_ms") + time_ms("recompute_ms");
  const double total_ms = json_finite(t, "total_ms", in_step);
  if (total_ms < run.compute_ms)
    fail(in_step, ": 'total_ms' ", total_ms, " is less than its compute part ", run.compute_ms, " ms");
  run.rest_ms = total_ms - run.compute_ms;
  std::vector<double> steps;
  const auto records = parse_training_log_file(dir + "/metrics.jsonl");
  for (const auto& r : records) {
    if (!r.contains("iteration") || !r["iteration"].is_number_integer() || r["iteration"].get<int64_t>() <= skip_first ||
        !r.contains("step_time_ms"))
      continue;
    const std::string in_record = where + ": metrics.jsonl iteration " + std::to_string(r["iteration"].get<int64_t>());
    const double ms = json_finite(r, "step_time_ms", in_record);
    if (!(ms > 0)) fail(in_record, ": 'step_time_ms' must be > 0, found ", ms);
    steps.push_back(ms);
  }
  if (steps.empty()) fail(where, ": no iterations after the ", skip_first, " warm-up ones (--skip-first)");
  run.measured_ms = median(steps);
  return run;
}

double median_abs_error(const std::vector<Run>& runs, double k) {
  std::vector<double> errors;
  for (const auto& r : runs) errors.push_back(std::abs(k * r.compute_ms + r.rest_ms - r.measured_ms) / r.measured_ms);
  return median(errors);
}

}  // namespace

void plan_calibrate(const CalibrateOptions& o) {
  if (o.runs.empty()) fail("plan --calibrate: name at least one run directory");
  if (o.device.empty()) fail("plan --calibrate: needs --device (the profile the runs were predicted on)");
  if (o.out.empty()) fail("plan --calibrate: needs --out (the calibrated profile to write)");
  if (std::filesystem::exists(std::filesystem::symlink_status(o.out)))
    fail("plan --calibrate: ", o.out, " exists (remove it first)");
  const DeviceProfile profile = load_device_profile(o.device);
  std::vector<Run> runs;
  for (const auto& dir : o.runs) runs.push_back(read_run(dir, profile.name, o.skip_first));
  // Least squares of measured - rest = k x compute.
  double num = 0, den = 0;
  for (const auto& r : runs) {
    num += (r.measured_ms - r.rest_ms) * r.compute_ms;
    den += r.compute_ms * r.compute_ms;
  }
  if (!(den > 0)) fail("plan --calibrate: the runs' predictions have no compute time to scale");
  const double k = num / den;
  if (!(k > 0))
    fail("plan --calibrate: the runs measured less than the prediction's non-compute part: nothing to fit with a "
         "compute scale (check the runs' profile and configuration)");

  std::printf("mmtrain plan --calibrate: %zu run(s) predicted on '%s'; compute takes %.3f x its predicted time\n",
              runs.size(), profile.name.c_str(), k);
  for (const auto& r : runs)
    std::printf("  %-48s measured %9.1f ms, predicted %9.1f ms before, %9.1f ms after\n", r.dir.c_str(), r.measured_ms,
                r.compute_ms + r.rest_ms, k * r.compute_ms + r.rest_ms);
  const double before = median_abs_error(runs, 1.0), after = median_abs_error(runs, k);
  std::printf("  median absolute error %.1f %% before, %.1f %% after\n", 100 * before, 100 * after);

  auto j = read_json(device_profile_path(o.device), "plan --calibrate: profile");
  const double gemm = std::min(1.0, profile.gemm_efficiency / k), attention = std::min(1.0, profile.attention_efficiency / k);
  if (gemm < profile.gemm_efficiency / k || attention < profile.attention_efficiency / k)
    std::printf("  (an efficiency above 1 was capped at 1: the profile's peaks are below what the runs reached)\n");
  j["efficiency"]["gemm"] = gemm;
  j["efficiency"]["attention"] = attention;
  std::string dirs;
  for (const auto& r : runs) dirs += (dirs.empty() ? "" : ", ") + r.dir;
  j["sources"]["efficiency"] = format("calibrated by `mmtrain plan --calibrate` on %zu run(s) (%s): compute took %.3f x "
                                      "the prediction of '%s', median absolute error %.1f %% -> %.1f %%",
                                      runs.size(), dirs.c_str(), k, o.device.c_str(), 100 * before, 100 * after);
  device_profile_from_json(j.dump(), o.out);  // it must load as a profile
  write_file_no_follow(o.out, j.dump(2) + "\n", "plan --calibrate --out");
  std::printf("  wrote %s (efficiency gemm %.3g, attention %.3g)\n", o.out.c_str(), gemm, attention);
  std::printf("%s\n", nlohmann::json({{"runs", runs.size()}, {"compute_scale", k}, {"median_abs_error_before", before},
                                      {"median_abs_error_after", after}, {"gemm_efficiency", gemm},
                                      {"attention_efficiency", attention}})
                          .dump()
                          .c_str());
}

}  // namespace mmtrain
