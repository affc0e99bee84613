#include "analysis/ablate.h"

#include "analysis/plots.h"
#include "cli/command.h"
#include "cli/python_runner.h"
#include "core/error.h"
#include "core/statistics.h"
#include "core/subprocess.h"
#include "core/text.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>

namespace mmtrain {
namespace fs = std::filesystem;
namespace {

// The measures of a table row, in the order of the markdown columns and the figure panels.
constexpr const char* kMeasures[] = {"loss_rel_diff", "allocated_change_pct", "rss_change_pct", "step_time_change_pct"};

bool is_valid_name(const std::string& name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; });
}

// A per-iteration measure after the warm-up: its median, and the standard error of the
// difference of two such medians (1.2533 sd sqrt(2 / n): the median's SE for a normal sample).
struct SteadySeries {
  std::vector<double> values;
  std::optional<double> median() const {
    if (values.empty()) return std::nullopt;
    return mmtrain::median(values);
  }
  std::optional<double> min() const {
    if (values.empty()) return std::nullopt;
    return *std::min_element(values.begin(), values.end());
  }
  std::optional<double> max() const {
    if (values.empty()) return std::nullopt;
    return *std::max_element(values.begin(), values.end());
  }
  double median_difference_se() const {
    const size_t n = values.size();
    if (n < 2) return 0.0;
    return 1.2533 * sample_sd(values) * std::sqrt(2.0 / static_cast<double>(n));
  }
};

// The numbers of one run the table compares.
struct ArmFigures {
  std::map<int64_t, double> loss;  // iteration -> loss (finite losses only)
  SteadySeries allocated_mb;       // each step's peak of tensor memory (memory.step_peak_mb)
  SteadySeries step_ms;
  std::optional<double> rss_mb;    // peak_rss_mb of the last record
};

ArmFigures arm_figures(const AblationArm& arm, int64_t skip) {
  ArmFigures f;
  for (const auto& r : arm.records) {
    const int64_t iteration = r["iteration"].get<int64_t>();
    if (r.contains("loss") && r["loss"].is_number() && std::isfinite(r["loss"].get<double>()))
      f.loss[iteration] = r["loss"].get<double>();
    if (r.contains("peak_rss_mb") && r["peak_rss_mb"].is_number()) f.rss_mb = r["peak_rss_mb"].get<double>();
    if (iteration <= skip) continue;
    if (r.contains("step_time_ms") && r["step_time_ms"].is_number())
      f.step_ms.values.push_back(r["step_time_ms"].get<double>());
    if (r.contains("memory") && r["memory"].contains("step_peak_mb"))
      f.allocated_mb.values.push_back(r["memory"]["step_peak_mb"].get<double>());
  }
  if (f.loss.empty()) fail("ablate: run '", arm.name, "' logged no finite loss");
  return f;
}

// sum |a - b| / sum |b| over the iterations both logged.
double loss_rel_diff(const ArmFigures& a, const ArmFigures& b, const std::string& name) {
  double diff = 0, base = 0;
  int64_t common = 0;
  for (const auto& [iteration, loss_b] : b.loss) {
    const auto found = a.loss.find(iteration);
    if (found == a.loss.end()) continue;
    diff += std::abs(found->second - loss_b);
    base += std::abs(loss_b);
    ++common;
  }
  if (common == 0) fail("ablate: run '", name, "' has no iteration in common with the control");
  return base > 0 ? diff / base : diff;
}

nlohmann::json change_pct(const std::optional<double>& value, const std::optional<double>& control) {
  if (!value || !control || *control == 0) return nullptr;
  return 100.0 * (*value - *control) / *control;
}

nlohmann::json or_null(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

// control_step_ms: the control's step time (the mean over its runs), which step times compare with.
nlohmann::ordered_json compare_arm(const AblationArm& arm, const ArmFigures& f, const ArmFigures& control,
                                   const std::optional<double>& control_step_ms) {
  nlohmann::ordered_json row = {{"name", arm.name},
                                {"overrides", arm.overrides},
                                {"loss_rel_diff", loss_rel_diff(f, control, arm.name)},
                                {"allocated_peak_mb", or_null(f.allocated_mb.max())},
                                {"allocated_change_pct", change_pct(f.allocated_mb.max(), control.allocated_mb.max())},
                                {"allocated_least_mb", or_null(f.allocated_mb.min())},
                                {"rss_peak_mb", or_null(f.rss_mb)},
                                {"rss_change_pct", change_pct(f.rss_mb, control.rss_mb)},
                                {"step_time_ms", or_null(f.step_ms.median())},
                                {"step_time_change_pct", change_pct(f.step_ms.median(), control_step_ms)}};
  return row;
}

// Student's t 0.975 quantile for df degrees of freedom (two-sided 95 %).
double student_t_975(int df) {
  static constexpr double kTable[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228};
  if (df < 1) return kTable[0];
  if (df <= 10) return kTable[df - 1];
  const double d = df;  // Cornish-Fisher beyond the table: within 0.003 of the exact value
  return 1.96 + 2.372 / d + 2.823 / (d * d);
}

std::string cell_number(const nlohmann::json& v, const char* fmt) {
  return v.is_number() ? format(fmt, v.get<double>()) : std::string("n/a");
}

std::string inside_mark(const nlohmann::json& inside) {
  if (!inside.is_boolean()) return "";
  return inside.get<bool>() ? " (noise)" : " **(outside)**";
}

}  // namespace

AblationFeature parse_ablation_feature(const std::string& argument) {
  const size_t colon = argument.find(':');
  if (colon == std::string::npos)
    fail("--feature '", argument, "': expected NAME:KEY=VALUE[,KEY=VALUE...], e.g. no_recompute:features.recompute=false");
  AblationFeature feature;
  feature.name = argument.substr(0, colon);
  if (!is_valid_name(feature.name))
    fail("--feature '", argument, "': the name '", feature.name, "' must be letters, digits, '_', '-' or '.'");
  if (feature.name.rfind("control", 0) == 0)
    fail("--feature '", argument, "': names beginning with 'control' are the control runs'; pick another name");
  const std::string rest = argument.substr(colon + 1);
  size_t start = 0;
  while (start <= rest.size()) {
    const size_t comma = rest.find(',', start);
    const std::string item = trim(rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (item.find('=') == std::string::npos || item.front() == '=')
      fail("--feature '", argument, "': '", item, "' is not KEY=VALUE");
    feature.overrides.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return feature;
}

nlohmann::ordered_json ablation_table(const std::vector<AblationArm>& controls, const std::vector<AblationArm>& features,
                                      int64_t skip) {
  if (controls.empty()) fail("ablate: no control run");
  std::vector<ArmFigures> runs;  // the control's, then its repeats'
  for (const auto& control : controls) runs.push_back(arm_figures(control, skip));
  const ArmFigures& base = runs[0];
  // The control's step time: the mean of its runs' medians (the repeats run between the
  // features, so this spans the machine's drift over the ablation).
  std::vector<double> control_medians;
  for (const auto& run : runs)
    if (const auto m = run.step_ms.median()) control_medians.push_back(*m);
  std::optional<double> control_step_ms;
  if (!control_medians.empty()) control_step_ms = mean(control_medians);

  nlohmann::ordered_json table = {{"steps", static_cast<int64_t>(base.loss.size())}, {"skip", skip}};
  table["control"] = {{"overrides", controls[0].overrides},
                      {"allocated_peak_mb", or_null(base.allocated_mb.max())},
                      {"allocated_least_mb", or_null(base.allocated_mb.min())},
                      {"rss_peak_mb", or_null(base.rss_mb)},
                      {"step_time_ms", or_null(control_step_ms)},
                      {"step_time_ms_per_run", control_medians},
                      {"steady_steps", static_cast<int64_t>(base.step_ms.values.size())}};
  nlohmann::ordered_json noise = {{"loss_rel_diff", nullptr},
                                  {"allocated_change_pct", nullptr},
                                  {"rss_change_pct", nullptr},
                                  {"step_time_change_pct", nullptr}};
  if (runs.size() > 1) {
    table["control_repeats"] = nlohmann::ordered_json::array();
    double loss_floor = 0, allocated_floor = 0;
    bool allocated_known = base.allocated_mb.max().has_value();
    for (size_t r = 1; r < runs.size(); ++r) {
      auto row = compare_arm(controls[r], runs[r], base, control_step_ms);
      loss_floor = std::max(loss_floor, row["loss_rel_diff"].get<double>());
      if (row["allocated_change_pct"].is_number())
        allocated_floor = std::max(allocated_floor, std::abs(row["allocated_change_pct"].get<double>()));
      else
        allocated_known = false;
      table["control_repeats"].push_back(std::move(row));
    }
    noise["loss_rel_diff"] = loss_floor;
    // The largest step's peak repeats within a fraction of a MiB (the least swings by several).
    if (allocated_known) noise["allocated_change_pct"] = std::max(allocated_floor, 100.0 / *base.allocated_mb.max());
    // Step time: a 95 % prediction interval for one more run's median, from the control runs'
    // medians (n of them): t(0.975, n - 1) x sd x sqrt(1 + 1 / n); at least 2 standard errors of
    // the difference of two medians of the control's steady steps.
    if (control_step_ms && control_medians.size() >= 2) {
      const double n = static_cast<double>(control_medians.size());
      const double between = student_t_975(static_cast<int>(n) - 1) * sample_sd(control_medians) * std::sqrt(1 + 1 / n);
      const double within = 2.0 * base.step_ms.median_difference_se();
      noise["step_time_change_pct"] = 100.0 * std::max(between, within) / *control_step_ms;
    }
    // RSS is not judged (null floor): identical CPU runs differ by several % (which malloc arena
    // serves a thread's frees depends on timing), more than a few repeats bound.
  }
  table["noise"] = noise;
  table["features"] = nlohmann::ordered_json::array();
  for (const auto& arm : features) {
    auto row = compare_arm(arm, arm_figures(arm, skip), base, control_step_ms);
    nlohmann::ordered_json inside;
    for (const char* key : kMeasures) {
      if (!noise[key].is_number() || !row[key].is_number()) {
        inside[key] = nullptr;
      } else {
        inside[key] = std::abs(row[key].get<double>()) <= noise[key].get<double>();
      }
    }
    row["inside_noise"] = inside;
    table["features"].push_back(std::move(row));
  }
  return table;
}

std::string ablation_markdown(const nlohmann::ordered_json& t) {
  const auto& c = t["control"];
  std::string md = format("# Feature ablation\n\n%lld steps per run; memory peaks and step times leave out the first %lld.\n\n",
                          static_cast<long long>(t["steps"].get<int64_t>()), static_cast<long long>(t["skip"].get<int64_t>()));
  md += "Control: " + cell_number(c["allocated_peak_mb"], "%.1f") + " MiB allocated peak (largest step; " + cell_number(c["allocated_least_mb"], "%.1f") + " MiB the least), " +
        cell_number(c["rss_peak_mb"], "%.1f") + " MiB peak RSS, " + cell_number(c["step_time_ms"], "%.1f") +
        " ms median step.\n\n";
  const auto& noise = t["noise"];
  if (t.contains("control_repeats")) {
    std::string per_run;
    for (const auto& ms : c["step_time_ms_per_run"]) per_run += (per_run.empty() ? "" : ", ") + format("%.1f", ms.get<double>());
    md += format("Noise floor (the control and %zu repeats, median step %s ms): loss ", t["control_repeats"].size(),
                 per_run.c_str()) +
          cell_number(noise["loss_rel_diff"], "%.2e") + ", allocated ±" + cell_number(noise["allocated_change_pct"], "%.2f") +
          " %, step time ±" + cell_number(noise["step_time_change_pct"], "%.2f") +
          " % (95 % prediction interval of one more run).\n\n";
    md += "RSS is reported, not judged: identical CPU runs differ by several %, more than one repeat can bound.\n\n";
  } else {
    md += "No noise floor: run with --control-repeats 3 to judge the differences.\n\n";
  }
  md += "| feature | overrides | loss sum\\|a-b\\|/sum\\|b\\| | allocated peak | RSS peak | step time |\n";
  md += "|---|---|---|---|---|---|\n";
  for (const auto& f : t["features"]) {
    std::string overrides;
    for (const auto& o : f["overrides"]) overrides += (overrides.empty() ? "" : ", ") + ("`" + o.get<std::string>() + "`");
    const auto& in = f["inside_noise"];
    md += "| " + f["name"].get<std::string>() + " | " + overrides + " | " + cell_number(f["loss_rel_diff"], "%.2e") +
          inside_mark(in["loss_rel_diff"]) + " | " + cell_number(f["allocated_peak_mb"], "%.1f MiB") + " (" +
          cell_number(f["allocated_change_pct"], "%+.2f %%") + ")" + inside_mark(in["allocated_change_pct"]) + " | " +
          cell_number(f["rss_peak_mb"], "%.1f MiB") + " (" + cell_number(f["rss_change_pct"], "%+.2f %%") + ")" +
          inside_mark(in["rss_change_pct"]) + " | " + cell_number(f["step_time_ms"], "%.1f ms") + " (" +
          cell_number(f["step_time_change_pct"], "%+.2f %%") + ")" + inside_mark(in["step_time_change_pct"]) + " |\n";
  }
  return md;
}

nlohmann::json ablation_figure(const nlohmann::ordered_json& table, const std::string& title) {
  auto number_or_null = [](const nlohmann::ordered_json& v) {
    return v.is_number() ? nlohmann::json(v.get<double>()) : nlohmann::json(nullptr);
  };
  nlohmann::json features = nlohmann::json::array();
  for (const auto& f : table["features"]) {
    nlohmann::json row = {{"name", f["name"].get<std::string>()}};
    for (const char* key : kMeasures) {
      row[key] = f[key].is_number() ? f[key].get<double>() : 0.0;  // a bar of 0 where not measured
      const auto& inside = f["inside_noise"][key];
      row["inside_noise"][key] = inside.is_boolean() ? nlohmann::json(inside.get<bool>()) : nlohmann::json(nullptr);
    }
    features.push_back(std::move(row));
  }
  nlohmann::json noise;
  for (const char* key : kMeasures) noise[key] = number_or_null(table["noise"][key]);
  return {{"figure", "ablation"}, {"title", title}, {"features", features}, {"noise", noise}};
}

namespace {

struct AblateOptions {
  std::string config_path;
  std::vector<std::string> feature_arguments;
  std::vector<std::string> overrides;
  int64_t steps = 20;
  int64_t skip = 5;
  int control_repeats = 0;
  int nproc = 2;
  std::string out_dir = "runs/ablation";
  std::string launcher;  // empty: <project Python> -m torch.distributed.run
  std::string title;
};

// Trains one arm into out_dir/runs/<name> and reads its metrics.
AblationArm run_arm(const AblateOptions& o, const std::string& name, const std::vector<std::string>& feature_overrides,
                    size_t index, size_t count) {
  const fs::path dir = fs::path(o.out_dir) / "runs" / name;
  fs::remove_all(dir);  // an arm is always a fresh run (the train command refuses an earlier one)
  fs::create_directories(dir);
  // Several ranks: torchrun (the project's Python's torch.distributed.run, or --launcher) starts
  // them; one rank: mmtrain itself.
  const bool project_torchrun = o.nproc > 1 && o.launcher.empty();
  std::vector<std::string> argv;
  if (o.nproc > 1) {
    argv = project_torchrun ? std::vector<std::string>{"-m", "torch.distributed.run"} : std::vector<std::string>{o.launcher};
    argv.insert(argv.end(), {"--standalone", "--nproc_per_node", std::to_string(o.nproc), "--no-python"});
  }
  argv.push_back((fs::path(executable_dir()) / "mmtrain").string());
  argv.insert(argv.end(), {"train", o.config_path});
  std::vector<std::string> overrides = o.overrides;
  overrides.insert(overrides.end(), feature_overrides.begin(), feature_overrides.end());
  // What every arm shares, set last so that no feature can change it.
  overrides.insert(overrides.end(), {"training.train_iters=" + std::to_string(o.steps), "training.save=", "training.load=",
                                     "logging.output_dir=" + dir.string(), "logging.progress=false",
                                     "tools.memory_profile.enable=true", "tools.memory_profile.start_step=1",
                                     "tools.memory_profile.end_step=0"});
  for (const auto& item : overrides) argv.insert(argv.end(), {"--set", item});
  std::string described;
  for (const auto& item : feature_overrides) described += (described.empty() ? "" : ", ") + item;
  std::printf("ablate: [%zu/%zu] %s%s%s ...\n", index, count, name.c_str(), described.empty() ? "" : ": ",
              described.c_str());
  std::fflush(stdout);
  ProcessOptions process;
  process.output_path = (dir / "train.log").string();
  const auto start = std::chrono::steady_clock::now();
  const int status = project_torchrun ? run_python(argv, process) : run_process(argv, process);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (status != 0) {
    std::ifstream log(process.output_path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(log, line);) lines.push_back(line);
    // The ranks' own errors ("mmtrain: error: ...") come before the launcher's summary of them.
    std::string errors, tail;
    int shown = 0;
    for (const auto& line : lines)
      if (line.find("error:") != std::string::npos && shown++ < 4) errors += "  " + line + "\n";
    for (size_t i = lines.size() > 10 ? lines.size() - 10 : 0; i < lines.size(); ++i) tail += "  " + lines[i] + "\n";
    fail("ablate: run '", name, "' failed with status ", status, " after ", format("%.1f", seconds), " s; its log (",
         process.output_path, ")", errors.empty() ? "" : " says:\n" + errors + "and", " ends:\n", tail);
  }
  std::printf("ablate: [%zu/%zu] %s done in %.1f s\n", index, count, name.c_str(), seconds);
  AblationArm arm;
  arm.name = name;
  arm.overrides = feature_overrides;
  arm.records = parse_training_log_file((dir / "metrics.jsonl").string());
  if (static_cast<int64_t>(arm.records.size()) != o.steps)
    fail("ablate: run '", name, "' logged ", arm.records.size(), " iterations, expected ", o.steps, " (",
         (dir / "metrics.jsonl").string(), ")");
  return arm;
}

void ablate(const AblateOptions& o) {
  if (o.steps < 2) fail("ablate: --steps must be at least 2, found ", o.steps);
  if (o.skip < 0 || o.skip >= o.steps) fail("ablate: --skip must be in [0, --steps), found ", o.skip);
  if (o.nproc < 1) fail("ablate: --nproc must be at least 1, found ", o.nproc);
  if (o.feature_arguments.empty()) fail("ablate: give at least one --feature NAME:KEY=VALUE");
  if (!fs::is_regular_file(o.config_path)) fail("ablate: config '", o.config_path, "' is not a file");
  std::vector<AblationFeature> features;
  std::set<std::string> names;
  for (const auto& argument : o.feature_arguments) {
    features.push_back(parse_ablation_feature(argument));
    if (!names.insert(features.back().name).second) fail("ablate: feature '", features.back().name, "' is given twice");
  }
  if (o.control_repeats < 0) fail("ablate: --control-repeats must be at least 0, found ", o.control_repeats);
  const size_t repeats = static_cast<size_t>(o.control_repeats);
  const size_t count = features.size() + 1 + repeats;
  size_t index = 0;
  std::vector<AblationArm> controls = {run_arm(o, "control", {}, ++index, count)};
  std::vector<AblationArm> arms;
  // Repeat j (1-based) runs after feature j * F / N: spread over the ablation, the last at the end.
  auto repeats_through = [&](size_t done_features) {
    while (controls.size() <= repeats && (controls.size() * features.size()) / repeats <= done_features)
      controls.push_back(run_arm(o, "control_repeat_" + std::to_string(controls.size()), {}, ++index, count));
  };
  for (const auto& feature : features) {
    arms.push_back(run_arm(o, feature.name, feature.overrides, ++index, count));
    if (repeats > 0) repeats_through(arms.size());
  }

  auto table = ablation_table(controls, arms, o.skip);
  table["config"] = o.config_path;
  table["nproc"] = o.nproc;
  const auto markdown = ablation_markdown(table);
  const fs::path out(o.out_dir);
  const auto md_path = (out / "ablation.md").string(), json_path = (out / "ablation.json").string(),
             png_path = (out / "ablation.png").string();
  std::ofstream(md_path) << markdown;
  std::ofstream(json_path) << table.dump(2) << "\n";
  const std::string title =
      o.title.empty() ? format("%s: %lld steps on %d rank%s", fs::path(o.config_path).filename().c_str(),
                               static_cast<long long>(o.steps), o.nproc, o.nproc == 1 ? "" : "s")
                      : o.title;
  draw_figure(ablation_figure(table, title), png_path);
  std::printf("\n%s\nwrote %s, %s, %s (runs under %s/runs)\n", markdown.c_str(), md_path.c_str(), json_path.c_str(),
              png_path.c_str(), o.out_dir.c_str());
  std::printf("%s\n", table.dump().c_str());
}

}  // namespace

void add_ablate_commands(CLI::App& app, Commands& commands) {
  auto o = std::make_shared<AblateOptions>();
  auto* ablate_cmd = app.add_subcommand(
      "ablate", "the seeds' feature ablation: control vs each feature (loss, memory, step time, noise floor)");
  ablate_cmd->add_option("config", o->config_path, "YAML config of the control run")->required();
  ablate_cmd
      ->add_option("--feature", o->feature_arguments,
                   "NAME:KEY=VALUE[,KEY=VALUE...]: a run with these overrides on top of the control (repeatable)")
      ->required();
  ablate_cmd->add_option("--set", o->overrides, "an override every run gets, control included (repeatable)");
  ablate_cmd->add_option("--steps", o->steps, "training iterations per run")->capture_default_str();
  ablate_cmd->add_option("--skip", o->skip, "warm-up iterations left out of memory peaks and step times")
      ->capture_default_str();
  ablate_cmd
      ->add_option("--control-repeats,--control_repeats", o->control_repeats,
                   "run the control N more times, spread between the features: their spread is the noise floor "
                   "each difference is judged against (3 or more for a useful floor; 0: nothing judged)")
      ->capture_default_str();
  ablate_cmd->add_option("--nproc", o->nproc, "ranks per run (torch.distributed.run when more than 1)")
      ->capture_default_str();
  ablate_cmd->add_option("--out", o->out_dir, "directory of ablation.md/.json/.png and the runs")->capture_default_str();
  ablate_cmd->add_option("--launcher", o->launcher,
                         "launcher program instead of `python -m torch.distributed.run` (e.g. torchrun)");
  ablate_cmd->add_option("--title", o->title, "figure title");
  commands.add(ablate_cmd, [o] { ablate(*o); });
}

}  // namespace mmtrain
