// Figures of training runs: mmtrain computes every number (analysis/logs.h parses the runs; this
// file smooths, differences and lays out the series) and hands a JSON figure spec to the plotter,
// the project's Python module mmtrain_py.plots.figures (cli/python_runner.h), which draws it with
// matplotlib into PNG, SVG or PDF.
#pragma once
#include "analysis/logs.h"

#include <string>
#include <vector>

namespace mmtrain {

// A run named for the figure's legend.
struct NamedRun {
  std::string name;
  std::string path;  // the metrics.jsonl or console log read
  std::string dir;   // the run's directory (or the log's path without its extension)
  bool named = false;  // the name came from NAME=
  std::vector<LogRecord> records;
  std::vector<LogRecord> evals;  // its held-out evaluations (kind "eval"), by iteration
};

// A log file's path: path itself, or a run's output directory's metrics.jsonl (every `logs` verb
// takes either).
std::string run_log_path(const std::string& path);
// "NAME=PATH" or "PATH"; PATH is a log file or a run's output directory (its metrics.jsonl). The
// default name is the run directory's name (a log file's stem).
NamedRun read_named_run(const std::string& argument);
// read_named_run of each; default names that collide ("a/run", "b/run") get their parent
// directories prepended until they differ.
std::vector<NamedRun> read_named_runs(const std::vector<std::string>& arguments);

// Debiased exponential moving average (TensorBoard's smoothing): s_t = w s_{t-1} + (1 - w) x_t,
// divided by 1 - w^t. Non-finite values are skipped (their slot repeats the last average).
std::vector<double> ema_smoothed(const std::vector<double>& values, double weight);

struct RunsPlotOptions {
  double smoothing = 0.6;   // EMA weight of the smoothed loss, in [0, 1)
  int64_t skip_first = 1;   // warm-up iterations drawn dotted in the step-time panel
  std::string title;
};

// Loss (raw and smoothed), grad norm, lr, step time, MFU and peak RSS against iteration, one
// colour per run; panels without data in any run are left out.
nlohmann::json runs_figure(const std::vector<NamedRun>& runs, const RunsPlotOptions& options);
// The seeds' two-run figure: both losses, their difference a - b over the common iterations (with
// sum|a-b|/sum|b|), and both step times after the warm-up.
nlohmann::json compare_figure(const NamedRun& a, const NamedRun& b, int64_t skip_first);

// Draws spec (its "out" set to out_path; the format from the extension: .png, .svg or .pdf).
void draw_figure(nlohmann::json spec, const std::string& out_path);

}  // namespace mmtrain
