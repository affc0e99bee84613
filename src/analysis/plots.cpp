#include "analysis/plots.h"

#include "cli/python_runner.h"
#include "core/error.h"
#include "core/text.h"
#include "io/atomic_file.h"

#include <cmath>
#include <filesystem>
#include <map>

namespace mmtrain {
namespace fs = std::filesystem;
namespace {

// The values of key per record (null where a record lacks it or it is not finite).
nlohmann::json column(const std::vector<LogRecord>& records, const char* key) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : records) {
    if (r.contains(key) && r[key].is_number() && std::isfinite(r[key].get<double>())) {
      out.push_back(r[key].get<double>());
    } else {
      out.push_back(nullptr);
    }
  }
  return out;
}

bool any_value(const nlohmann::json& values) {
  for (const auto& v : values)
    if (!v.is_null()) return true;
  return false;
}

std::vector<double> numbers(const nlohmann::json& values) {
  std::vector<double> out;
  for (const auto& v : values) out.push_back(v.is_null() ? NAN : v.get<double>());
  return out;
}

// A run's evaluations beside its steps: eval_iteration, eval_loss and, for a diffusion model,
// eval_timesteps {"t0.1": [...], ...} (the loss at each fixed timestep).
void add_eval_series(const NamedRun& run, nlohmann::json& series) {
  if (run.evals.empty()) return;
  series["eval_iteration"] = column(run.evals, "iteration");
  series["eval_loss"] = column(run.evals, "eval_loss");
  nlohmann::json timesteps = nlohmann::json::object();
  for (const auto& [key, value] : run.evals.front().items())
    if (key.rfind("eval_loss_t", 0) == 0) timesteps[key.substr(std::string("eval_loss_").size())] = column(run.evals, key.c_str());
  if (!timesteps.empty()) series["eval_timesteps"] = std::move(timesteps);
}

// The frame grid of the run's latest sample (<dir>/samples/iter_N/<first>.grid.png, written by
// training's sampling with a decoder: train/training_sampler.h), for a panel beside the curves.
// Null when the run has none; a grid that is not a small regular file is left out.
nlohmann::json latest_sample_grid(const NamedRun& run) {
  constexpr uintmax_t kMaxGridBytes = uintmax_t{64} << 20;
  const fs::path samples = fs::path(run.dir) / "samples";
  std::error_code error;
  if (!fs::is_directory(fs::symlink_status(samples, error))) return nullptr;  // a link is never followed
  std::map<std::string, fs::path> grids;  // iter_N directory name (zero-padded: sorts) -> its first grid
  for (const auto& iteration : fs::directory_iterator(samples, error)) {
    const std::string name = iteration.path().filename().string();
    // Only what the trainer names iter_<digits> (at most 18: an int64); anything else there is not a sample.
    const bool iter_name = name.rfind("iter_", 0) == 0 && name.size() > 5 && name.size() <= 23 &&
                           name.find_first_not_of("0123456789", 5) == std::string::npos;
    if (!iter_name || !iteration.is_directory(error) || iteration.is_symlink(error)) continue;
    for (const auto& file : fs::directory_iterator(iteration.path(), error)) {
      const std::string file_name = file.path().filename().string();
      if (file_name.size() > 9 && file_name.compare(file_name.size() - 9, 9, ".grid.png") == 0 &&
          file.is_regular_file(error) && !file.is_symlink(error) && file.file_size(error) <= kMaxGridBytes &&
          (!grids.count(name) || file.path() < grids[name]))
        grids[name] = file.path();
    }
  }
  if (grids.empty()) return nullptr;
  const auto& [directory, grid] = *grids.rbegin();
  return {{"path", grid.string()}, {"iteration", std::stoll(directory.substr(5))}};
}

}  // namespace

std::string run_log_path(const std::string& path) {
  auto p = fs::path(path).lexically_normal();
  if (!fs::is_directory(p)) return p.string();
  if (!fs::exists(p / "metrics.jsonl")) fail("run '", path, "': a directory without metrics.jsonl");
  return (p / "metrics.jsonl").string();
}

NamedRun read_named_run(const std::string& argument) {
  NamedRun run;
  std::string path = argument;
  const size_t equals = argument.find('=');
  if (equals != std::string::npos && equals > 0) {
    run.name = argument.substr(0, equals);
    run.named = true;
    path = argument.substr(equals + 1);
  }
  const auto p = fs::path(run_log_path(path));
  run.dir = p.filename() == "metrics.jsonl" && p.has_parent_path() ? p.parent_path().string()
                                                                  : (p.parent_path() / p.stem()).string();
  if (!run.named) run.name = fs::path(run.dir).filename().string();
  run.path = p.string();
  run.records = parse_training_log_file(run.path);
  run.evals = parse_eval_records_file(run.path);
  return run;
}

std::vector<NamedRun> read_named_runs(const std::vector<std::string>& arguments) {
  std::vector<NamedRun> runs;
  for (const auto& argument : arguments) runs.push_back(read_named_run(argument));
  for (int depth = 2; depth <= 4; ++depth) {
    std::map<std::string, int> count;
    for (const auto& run : runs) ++count[run.name];
    for (auto& run : runs) {
      if (run.named || count[run.name] < 2) continue;
      auto dir = fs::path(run.dir);
      std::vector<std::string> parts;
      for (const auto& part : dir) parts.push_back(part.string());
      std::string name;
      for (size_t i = parts.size() > static_cast<size_t>(depth) ? parts.size() - depth : 0; i < parts.size(); ++i)
        name += (name.empty() ? "" : "/") + parts[i];
      run.name = name;
    }
  }
  return runs;
}

std::vector<double> ema_smoothed(const std::vector<double>& values, double weight) {
  if (!(weight >= 0.0 && weight < 1.0)) fail("smoothing weight must be in [0, 1), found ", weight);
  std::vector<double> out;
  double average = 0.0, correction = 1.0;
  bool started = false;
  for (double x : values) {
    if (std::isfinite(x)) {
      average = weight * average + (1.0 - weight) * x;
      correction *= weight;
      started = true;
    }
    out.push_back(started ? average / (1.0 - correction) : NAN);
  }
  return out;
}

nlohmann::json runs_figure(const std::vector<NamedRun>& runs, const RunsPlotOptions& o) {
  if (runs.empty()) fail("logs plot: no runs given");
  nlohmann::json spec = {{"figure", "runs"}, {"title", o.title}, {"smoothing", o.smoothing},
                         {"skip_first", o.skip_first}, {"runs", nlohmann::json::array()}};
  for (const auto& run : runs) {
    nlohmann::json series = {{"iteration", column(run.records, "iteration")},
                             {"warmup", std::min<int64_t>(o.skip_first, static_cast<int64_t>(run.records.size()))}};
    for (const char* key :
         {"loss", "grad_norm", "lr", "step_time_ms", "mfu", "peak_rss_mb", "dp_work_imbalance", "dp_compute_imbalance",
          "budget_fill", "rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected", "reward", "kl",
          "completions/mean_length"}) {
      auto values = column(run.records, key);
      if (any_value(values)) series[key] = std::move(values);
    }
    if (series.contains("loss")) {
      nlohmann::json smoothed = nlohmann::json::array();
      for (double v : ema_smoothed(numbers(series["loss"]), o.smoothing))
        smoothed.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr));
      series["loss_smoothed"] = std::move(smoothed);
    }
    add_eval_series(run, series);
    spec["runs"].push_back({{"name", run.name}, {"series", std::move(series)}, {"sample_grid", latest_sample_grid(run)}});
  }
  return spec;
}

nlohmann::json compare_figure(const NamedRun& a, const NamedRun& b, int64_t skip_first) {
  LogStatsOptions stats;
  stats.skip_first = skip_first;
  const auto comparison = compare_training_logs(a.records, b.records, stats);
  std::map<int64_t, double> loss_b;
  for (const auto& r : b.records)
    if (r.contains("loss") && r["loss"].is_number()) loss_b[r["iteration"].get<int64_t>()] = r["loss"].get<double>();
  nlohmann::json common = nlohmann::json::array(), difference = nlohmann::json::array();
  for (const auto& r : a.records) {
    if (!r.contains("loss") || !r["loss"].is_number()) continue;
    const auto found = loss_b.find(r["iteration"].get<int64_t>());
    if (found == loss_b.end()) continue;
    common.push_back(found->first);
    difference.push_back(r["loss"].get<double>() - found->second);
  }
  auto side = [&](const NamedRun& run, const LogRecord& summary) {
    const size_t skip = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(skip_first, 0)), run.records.size());
    const std::vector<LogRecord> steady(run.records.begin() + static_cast<std::ptrdiff_t>(skip), run.records.end());
    nlohmann::json out = {{"name", run.name},
                          {"iteration", column(run.records, "iteration")},
                          {"loss", column(run.records, "loss")},
                          {"steady_iteration", column(steady, "iteration")},
                          {"steady_step_time_ms", column(steady, "step_time_ms")},
                          {"step_time_median", nullptr}};
    add_eval_series(run, out);
    if (summary.contains("step_time_ms")) out["step_time_median"] = summary["step_time_ms"]["median"];
    return out;
  };
  const auto& rel = comparison["loss_rel_diff"];
  return {{"figure", "compare"},
          {"title", a.name + " vs " + b.name},
          {"a", side(a, comparison["a"])},
          {"b", side(b, comparison["b"])},
          {"common_iteration", common},
          {"loss_difference", difference},
          {"loss_rel_diff", rel.is_number() ? format("%.3e", rel.get<double>()) : std::string("n/a")},
          {"skip_first", skip_first}};
}

void draw_figure(nlohmann::json spec, const std::string& out_path) {
  const auto extension = fs::path(out_path).extension().string();
  if (extension != ".png" && extension != ".svg" && extension != ".pdf")
    fail("figure '", out_path, "': expected a .png, .svg or .pdf file name");
  const auto parent = fs::path(out_path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  spec["out"] = out_path;
  run_python_module_with_input("plots.figures", spec.dump(), "the plotter");
}

}  // namespace mmtrain
