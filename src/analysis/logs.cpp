#include "analysis/logs.h"

#include "analysis/plots.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/regular_file.h"
#include "core/statistics.h"
#include "core/text.h"
#include "io/user_file.h"
#include "record/eval_record.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

namespace mmtrain {

namespace fs = std::filesystem;
namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "number of skipped iterations" -> "number_of_skipped_iterations"
std::string snake_case(const std::string& key) {
  std::string out;
  for (char c : lower(key)) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += c;
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

// Console keys with a fixed meaning; everything else keeps its snake_case name.
std::string normalized_key(const std::string& key) {
  static const std::map<std::string, std::string> known = {
      {"consumed samples", "consumed_samples"},
      {"elapsed time per iteration (ms)", "step_time_ms"},
      {"learning rate", "lr"},
      {"global batch size", "global_batch_size"},
      {"grad norm", "grad_norm"},
      {"tflop/s per device", "tflops_per_device"},
      {"throughput per gpu (tflop/s/gpu)", "tflops_per_device"},
      {"mfu", "mfu"},
      {"loss", "loss"},
  };
  const auto found = known.find(lower(key));
  return found != known.end() ? found->second : snake_case(key);
}

// Digits at s[pos...]; advances pos. nullopt when there are none.
std::optional<int64_t> read_int(const std::string& s, size_t& pos) {
  const size_t begin = pos;
  while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) ++pos;
  if (pos == begin) return std::nullopt;
  return std::stoll(s.substr(begin, pos - begin));
}

void skip_spaces(const std::string& s, size_t& pos) {
  while (pos < s.size() && s[pos] == ' ') ++pos;
}

bool is_integer_key(const std::string& key) {
  return key == "consumed_samples" || key == "global_batch_size" || key == "tokens" || key.rfind("number_of_", 0) == 0;
}

// Finite numbers of `key` over records (NaN losses are logged as null and are skipped).
std::vector<double> values(const std::vector<LogRecord>& records, const char* key) {
  std::vector<double> out;
  for (const auto& r : records)
    if (r.contains(key) && r[key].is_number()) out.push_back(r[key].get<double>());
  return out;
}

void put_stats(LogRecord& out, const char* key, const std::vector<double>& v) {
  if (v.empty()) return;
  out[key] = {{"median", median(v)}, {"mean", mean(v)}, {"p95", percentile(v, 95)}, {"count", v.size()}};
}

}  // namespace

std::optional<LogRecord> parse_log_line(const std::string& line) {
  // "iteration N/M |" or "iteration N |", anywhere after a timestamp or rank prefix.
  size_t pos = std::string::npos;
  int64_t iteration = 0;
  std::optional<int64_t> train_iters;
  for (size_t at = line.find("iteration"); at != std::string::npos; at = line.find("iteration", at + 1)) {
    size_t p = at + 9;
    skip_spaces(line, p);
    const auto n = read_int(line, p);
    if (!n) continue;
    skip_spaces(line, p);
    std::optional<int64_t> m;
    if (p < line.size() && line[p] == '/') {
      ++p;
      skip_spaces(line, p);
      m = read_int(line, p);
      if (!m) continue;
      skip_spaces(line, p);
    }
    if (p < line.size() && line[p] != '|') continue;
    iteration = *n;
    train_iters = m;
    pos = p;
    break;
  }
  if (pos == std::string::npos) return std::nullopt;

  LogRecord r;
  r["iteration"] = iteration;
  if (train_iters) r["train_iters"] = *train_iters;
  std::vector<std::string> loss_keys;
  size_t begin = pos;
  while (begin < line.size()) {
    size_t end = line.find('|', begin + 1);
    if (end == std::string::npos) end = line.size();
    const auto segment = trim(line.substr(begin + (line[begin] == '|' ? 1 : 0), end - begin - (line[begin] == '|' ? 1 : 0)));
    begin = end;
    const size_t colon = segment.find(':');
    if (colon == std::string::npos) continue;  // "ETA 12 s" and other free text
    const auto raw_key = trim(segment.substr(0, colon));
    const auto text = trim(segment.substr(colon + 1));
    if (raw_key.empty() || text.empty()) continue;
    const auto key = normalized_key(raw_key);
    char* rest = nullptr;
    const double value = std::strtod(text.c_str(), &rest);
    if (rest == text.c_str()) {
      r[key] = text;  // not a number: keep the text
      continue;
    }
    const bool percent = trim(rest) == "%";
    if (key == "mfu") {
      r[key] = percent ? value / 100.0 : value;
    } else if (!std::isfinite(value)) {
      r[key] = nullptr;  // nan / inf: JSON has no such numbers
    } else if (is_integer_key(key) && value == std::floor(value)) {
      r[key] = static_cast<int64_t>(value);
    } else {
      r[key] = value;
    }
    const auto lower_key = lower(raw_key);
    if (lower_key.size() >= 4 && lower_key.compare(lower_key.size() - 4, 4, "loss") == 0) loss_keys.push_back(key);
  }
  // The run's loss: "loss" itself, else Megatron's "lm loss", else the first "... loss" term.
  if (!r.contains("loss") && !loss_keys.empty()) {
    const bool lm = std::find(loss_keys.begin(), loss_keys.end(), "lm_loss") != loss_keys.end();
    r["loss"] = r[lm ? "lm_loss" : loss_keys.front()];
  }
  return r;
}

bool is_eval_record(const LogRecord& record) {
  return record.contains("kind") && record["kind"] == kEvalRecordKind;
}

std::vector<LogRecord> parse_eval_records_file(const std::string& path) {
  require_regular_file(path, "training log '" + path + "'", "a metrics.jsonl");
  std::istringstream in(read_user_file(path, "training log '" + path + "'", kMaxTextFileBytes));
  std::map<int64_t, LogRecord> by_iteration;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    const auto text = trim(line);
    if (text.empty() || text.front() != '{') continue;
    auto parsed = ordered_json_parse_checked(text, path + ":" + std::to_string(number) + ": a metrics record");
    if (parsed.is_object() && is_eval_record(parsed) && parsed.contains("iteration") &&
        parsed["iteration"].is_number_integer() && parsed.contains("eval_loss") &&
        (parsed["eval_loss"].is_number() || parsed["eval_loss"].is_null()))  // null: a NaN/Inf loss
    {
      // The key first: json's operator= takes its argument by value, built before the left side.
      const int64_t iteration = parsed["iteration"].get<int64_t>();
      by_iteration[iteration] = std::move(parsed);
    }
  }
  std::vector<LogRecord> out;
  for (auto& [iteration, record] : by_iteration) out.push_back(std::move(record));
  return out;
}

LogRecord eval_summary(const std::vector<LogRecord>& evals) {
  LogRecord out;
  out["evaluations"] = evals.size();
  if (evals.empty()) return out;
  out["last_eval_loss"] = evals.back()["eval_loss"];
  out["last_eval_iteration"] = evals.back()["iteration"];
  const LogRecord* best = nullptr;  // the lowest finite loss; a NaN/Inf one is never the best
  int64_t non_finite = 0;
  for (const auto& e : evals) {
    const double loss = e["eval_loss"].is_number() ? e["eval_loss"].get<double>() : NAN;
    if (!std::isfinite(loss)) ++non_finite;
    if (std::isfinite(loss) && (!best || loss < (*best)["eval_loss"].get<double>())) best = &e;
  }
  out["non_finite_evaluations"] = non_finite;
  if (best) {
    out["best_eval_loss"] = (*best)["eval_loss"];
    out["best_eval_iteration"] = (*best)["iteration"];
  }
  return out;
}

std::vector<LogRecord> parse_training_log(std::istream& in, const std::string& source) {
  std::map<int64_t, LogRecord> by_iteration;
  std::string line;
  int64_t line_number = 0, repeated = 0;
  while (std::getline(in, line)) {
    ++line_number;
    const auto text = trim(line);
    if (text.empty()) continue;
    std::optional<LogRecord> record;
    if (text.front() == '{') {
      auto parsed = ordered_json_parse_checked(text, source + ":" + std::to_string(line_number) + ": a metrics record");
      // A record with a kind (an evaluation, a sampling phase) is not a step.
      if (parsed.is_object() && parsed.contains("iteration") && parsed["iteration"].is_number_integer() &&
          !parsed.contains("kind"))
        record = std::move(parsed);
    } else {
      record = parse_log_line(text);
    }
    if (!record) continue;
    const int64_t iteration = record->at("iteration").get<int64_t>();
    if (by_iteration.count(iteration)) ++repeated;
    by_iteration[iteration] = std::move(*record);
  }
  if (repeated > 0)
    std::fprintf(stderr, "logs: %s: %lld iterations appear more than once (a resumed or repeated run appended to "
                 "this log); the later records are used\n", source.c_str(), static_cast<long long>(repeated));
  std::vector<LogRecord> out;
  for (auto& [iteration, record] : by_iteration) out.push_back(std::move(record));
  return out;
}

std::vector<LogRecord> parse_training_log_file(const std::string& path) {
  std::istringstream in(read_user_file(path, "training log '" + path + "'", kMaxTextFileBytes));
  auto records = parse_training_log(in, path);
  if (records.empty())
    fail("training log '", path, "': expected metrics.jsonl records or 'iteration N/M | ...' lines, found none");
  return records;
}

LogRecord log_summary(const std::vector<LogRecord>& records, const LogStatsOptions& o) {
  if (records.empty()) fail("log summary: no iteration records");
  if (o.skip_first < 0 || o.window < 0)
    fail("log summary: --skip-first and --window must be >= 0, found ", o.skip_first, " and ", o.window);
  LogRecord out;
  out["iterations"] = records.size();
  out["first_iteration"] = records.front()["iteration"];
  out["last_iteration"] = records.back()["iteration"];
  const size_t skip = std::min<size_t>(static_cast<size_t>(o.skip_first), records.size() - 1);
  out["skipped_warmup"] = skip;
  const std::vector<LogRecord> steady(records.begin() + static_cast<std::ptrdiff_t>(skip), records.end());

  const auto step = values(steady, "step_time_ms");
  put_stats(out, "step_time_ms", step);
  if (!step.empty()) {
    const double seconds = median(step) / 1000.0;
    const auto gbs = values(steady, "global_batch_size");
    if (!gbs.empty() && seconds > 0) out["samples_per_s"] = median(gbs) / seconds;
    const auto tokens = values(steady, "tokens");
    if (!tokens.empty() && seconds > 0) out["tokens_per_s"] = median(tokens) / seconds;
  }
  const auto tflops = values(steady, "tflops_per_device");
  if (!tflops.empty()) out["tflops_per_device_median"] = median(tflops);
  const auto mfu = values(steady, "mfu");
  if (!mfu.empty()) out["mfu_median"] = median(mfu);
  for (const char* key :
       {"dp_work_imbalance", "dp_compute_imbalance", "dp_work_imbalance_bound", "budget_fill", "micro_batches"}) {
    const auto balance = values(steady, key);
    if (!balance.empty()) out[std::string(key) + "_median"] = median(balance);
  }
  if (const auto skipped = values(records, "samples_skipped"); !skipped.empty())
    out["samples_skipped"] = std::accumulate(skipped.begin(), skipped.end(), 0.0);

  // The run against its plan (plan/run_prediction.h): measured over predicted.
  const auto predicted_step = values(steady, "predicted_step_time_ms");
  if (!step.empty() && !predicted_step.empty() && median(predicted_step) > 0) {
    out["predicted_step_time_ms"] = median(predicted_step);
    out["step_time_over_predicted"] = median(step) / median(predicted_step);
  }
  // Peaks: RSS (a CPU run's memory) and, on CUDA, the caching allocator's allocated bytes.
  auto peak_over_predicted = [&](const char* measured_key, const char* predicted_key, const char* ratio_key) {
    const auto measured = values(records, measured_key), predicted = values(records, predicted_key);
    if (measured.empty() || predicted.empty()) return;
    const double peak = *std::max_element(measured.begin(), measured.end());
    const double planned = *std::max_element(predicted.begin(), predicted.end());
    out[predicted_key] = planned;
    if (planned > 0) out[ratio_key] = peak / planned;
  };
  peak_over_predicted("peak_rss_mb", "predicted_peak_rss_mb", "peak_rss_over_predicted");
  peak_over_predicted("peak_device_allocated_mb", "predicted_peak_device_mb", "peak_device_over_predicted");

  const auto loss = values(records, "loss");
  if (!loss.empty()) {
    out["loss_mean"] = mean(loss);
    out["loss_last"] = loss.back();
  }
  const auto grad = values(records, "grad_norm");
  if (!grad.empty()) out["grad_norm_last"] = grad.back();
  if (o.window > 0) {
    const size_t w = std::min<size_t>(static_cast<size_t>(o.window), records.size());
    const std::vector<LogRecord> tail(records.end() - static_cast<std::ptrdiff_t>(w), records.end());
    LogRecord last = {{"iterations", w}};
    const auto tail_loss = values(tail, "loss");
    if (!tail_loss.empty()) last["loss_mean"] = mean(tail_loss);
    const auto tail_step = values(tail, "step_time_ms");
    if (!tail_step.empty()) last["step_time_ms_mean"] = mean(tail_step);
    out["last_window"] = last;
  }
  return out;
}

LogRecord compare_training_logs(const std::vector<LogRecord>& a, const std::vector<LogRecord>& b,
                                const LogStatsOptions& o) {
  std::map<int64_t, double> loss_b;
  for (const auto& r : b)
    if (r.contains("loss") && r["loss"].is_number()) loss_b[r["iteration"].get<int64_t>()] = r["loss"].get<double>();
  std::vector<std::pair<int64_t, std::pair<double, double>>> common;  // iteration -> (a, b)
  for (const auto& r : a) {
    if (!r.contains("loss") || !r["loss"].is_number()) continue;
    const auto found = loss_b.find(r["iteration"].get<int64_t>());
    if (found != loss_b.end()) common.push_back({found->first, {r["loss"].get<double>(), found->second}});
  }
  auto loss_agreement = [](const std::vector<std::pair<int64_t, std::pair<double, double>>>& pairs) {
    LogRecord out = {{"common_iterations", pairs.size()}};
    if (pairs.empty()) return out;
    double sum_diff = 0, sum_b = 0, max_diff = -1;
    int64_t at = 0;
    for (const auto& [iteration, ab] : pairs) {
      const double diff = std::abs(ab.first - ab.second);
      sum_diff += diff;
      sum_b += std::abs(ab.second);
      if (diff > max_diff) {
        max_diff = diff;
        at = iteration;
      }
    }
    out["loss_rel_diff"] = sum_b > 0 ? LogRecord(sum_diff / sum_b) : LogRecord(nullptr);
    out["loss_max_abs_diff"] = max_diff;
    out["loss_max_abs_diff_iteration"] = at;
    return out;
  };

  LogRecord out = loss_agreement(common);
  if (o.window > 0 && !common.empty()) {
    const size_t w = std::min<size_t>(static_cast<size_t>(o.window), common.size());
    out["last_window"] = loss_agreement({common.end() - static_cast<std::ptrdiff_t>(w), common.end()});
  }
  out["a"] = log_summary(a, o);
  out["b"] = log_summary(b, o);
  if (out["a"].contains("step_time_ms") && out["b"].contains("step_time_ms")) {
    const double ma = out["a"]["step_time_ms"]["median"].get<double>();
    const double mb = out["b"]["step_time_ms"]["median"].get<double>();
    if (mb > 0) out["step_time_ratio"] = ma / mb;  // a / b: below 1 means a is faster
  }
  return out;
}

namespace {

void logs_parse(const std::string& path) {
  for (const auto& record : parse_training_log_file(path)) std::printf("%s\n", record.dump().c_str());
}

// The human lines of one run's summary (log_summary's fields).
void print_summary(const char* label, const std::string& path, const LogRecord& s) {
  std::printf("%s: %s\n", label, path.c_str());
  std::printf("   %lld iterations (%lld..%lld)", static_cast<long long>(s["iterations"].get<int64_t>()),
              static_cast<long long>(s["first_iteration"].get<int64_t>()),
              static_cast<long long>(s["last_iteration"].get<int64_t>()));
  if (s.contains("step_time_ms"))
    std::printf("; step time after %lld warm-up: median %.2f ms, mean %.2f, p95 %.2f",
                static_cast<long long>(s["skipped_warmup"].get<int64_t>()), s["step_time_ms"]["median"].get<double>(),
                s["step_time_ms"]["mean"].get<double>(), s["step_time_ms"]["p95"].get<double>());
  std::printf("\n");
  if (s.contains("samples_per_s")) std::printf("   throughput %.4g samples/s", s["samples_per_s"].get<double>());
  if (s.contains("tokens_per_s")) std::printf(", %.4g tokens/s", s["tokens_per_s"].get<double>());
  if (s.contains("tflops_per_device_median"))
    std::printf(", %.3f TFLOP/s per device", s["tflops_per_device_median"].get<double>());
  if (s.contains("mfu_median")) std::printf(", MFU %.2f %%", 100.0 * s["mfu_median"].get<double>());
  if (s.contains("samples_per_s") || s.contains("tflops_per_device_median")) std::printf("\n");
  if (s.contains("dp_compute_imbalance_median")) {
    std::printf("   rank balance (max / mean, median): compute %.3f", s["dp_compute_imbalance_median"].get<double>());
    if (s.contains("dp_work_imbalance_median"))
      std::printf(", predicted work %.3f", s["dp_work_imbalance_median"].get<double>());
    if (s.contains("dp_work_imbalance_bound_median"))
      std::printf(" (best possible %.3f)", s["dp_work_imbalance_bound_median"].get<double>());
    std::printf("\n");
  }
  if (s.contains("budget_fill_median"))  // token-budget micro-batches
    std::printf("   token budget (median): %.0f micro-batches per rank, %.1f %% full; %.0f samples skipped over it\n",
                s["micro_batches_median"].get<double>(), 100.0 * s["budget_fill_median"].get<double>(),
                s.value("samples_skipped", 0.0));
  // The run against its plan, on one line: each measured / predicted figure the summary has.
  const char* lead = "   against its plan:";
  auto against = [&](const std::string& text) {
    std::printf("%s %s", lead, text.c_str());
    lead = ";";
  };
  if (s.contains("step_time_over_predicted"))
    against(format("step time %.3f x the predicted %.1f ms", s["step_time_over_predicted"].get<double>(),
                   s["predicted_step_time_ms"].get<double>()));
  if (s.contains("peak_rss_over_predicted"))
    against(format("peak RSS %.3f x the predicted %.0f MB", s["peak_rss_over_predicted"].get<double>(),
                   s["predicted_peak_rss_mb"].get<double>()));
  if (s.contains("peak_device_over_predicted"))
    against(format("peak device memory %.3f x the predicted %.0f MB", s["peak_device_over_predicted"].get<double>(),
                   s["predicted_peak_device_mb"].get<double>()));
  if (*lead == ';') std::printf("\n");
  if (s.contains("loss_mean"))
    std::printf("   loss mean %.6f, last %.6f\n", s["loss_mean"].get<double>(), s["loss_last"].get<double>());
  if (s.contains("last_window") && s["last_window"].contains("loss_mean"))
    std::printf("   last %lld iterations: loss mean %.6f\n",
                static_cast<long long>(s["last_window"]["iterations"].get<int64_t>()),
                s["last_window"]["loss_mean"].get<double>());
}

namespace {

std::string loss_text(const nlohmann::ordered_json& value) {
  return value.is_number() ? format("%.6f", value.get<double>()) : std::string("NaN/Inf");
}

// "   validation (N evaluations): last eval_loss X after iteration I; best Y after iteration J"
void print_eval_summary(const LogRecord& e) {
  std::printf("   validation (%lld evaluations): last eval_loss %s after iteration %lld",
              static_cast<long long>(e["evaluations"].get<int64_t>()), loss_text(e["last_eval_loss"]).c_str(),
              static_cast<long long>(e["last_eval_iteration"].get<int64_t>()));
  if (e.contains("best_eval_loss"))
    std::printf("; best %.6f after iteration %lld", e["best_eval_loss"].get<double>(),
                static_cast<long long>(e["best_eval_iteration"].get<int64_t>()));
  if (e["non_finite_evaluations"].get<int64_t>() > 0)
    std::printf("; %lld NaN/Inf", static_cast<long long>(e["non_finite_evaluations"].get<int64_t>()));
  std::printf("\n");
}

// Two runs' validation curves at the iterations both evaluated: sum|a-b| / sum|b| of eval_loss,
// and the largest difference.
LogRecord compare_evals(const std::vector<LogRecord>& a, const std::vector<LogRecord>& b) {
  std::map<int64_t, double> loss_b;
  for (const auto& e : b)
    if (e["eval_loss"].is_number()) loss_b[e["iteration"].get<int64_t>()] = e["eval_loss"].get<double>();
  double diff = 0, base = 0, worst = -1;
  int64_t common = 0, worst_at = 0;
  for (const auto& e : a) {
    const auto found = loss_b.find(e["iteration"].get<int64_t>());
    if (!e["eval_loss"].is_number() || found == loss_b.end()) continue;
    const double d = std::abs(e["eval_loss"].get<double>() - found->second);
    diff += d;
    base += std::abs(found->second);
    ++common;
    if (d > worst) {
      worst = d;
      worst_at = found->first;
    }
  }
  LogRecord out = {{"a", eval_summary(a)}, {"b", eval_summary(b)}, {"common_evaluations", common}};
  if (common > 0 && base > 0) {
    out["eval_loss_rel_diff"] = diff / base;
    out["eval_loss_max_abs_diff"] = worst;
    out["eval_loss_max_abs_diff_iteration"] = worst_at;
  }
  return out;
}

}  // namespace

void logs_summary(const std::string& path, const LogStatsOptions& options) {
  auto summary = log_summary(parse_training_log_file(path), options);
  print_summary("run", path, summary);
  if (const auto evals = parse_eval_records_file(path); !evals.empty()) {
    summary["eval"] = eval_summary(evals);
    print_eval_summary(summary["eval"]);
  }
  std::printf("%s\n", summary.dump().c_str());
}

void logs_compare(const std::string& path_a, const std::string& path_b, const LogStatsOptions& options,
                  const std::string& plot_path) {
  const auto runs = read_named_runs({path_a, path_b});
  const auto& a = runs[0];
  const auto& b = runs[1];
  auto out = compare_training_logs(a.records, b.records, options);
  print_summary("A", a.path, out["a"]);
  print_summary("B", b.path, out["b"]);
  if (out["common_iterations"].get<int64_t>() > 0 && out["loss_rel_diff"].is_number())
    std::printf("loss over %lld common iterations: relative difference %.3e (sum|a-b|/sum|b|), max |a-b| %.3e at "
                "iteration %lld\n",
                static_cast<long long>(out["common_iterations"].get<int64_t>()), out["loss_rel_diff"].get<double>(),
                out["loss_max_abs_diff"].get<double>(),
                static_cast<long long>(out["loss_max_abs_diff_iteration"].get<int64_t>()));
  else
    std::printf("loss: no common iterations with a finite loss\n");
  if (out.contains("step_time_ratio"))
    std::printf("step time A/B (medians): %.4f\n", out["step_time_ratio"].get<double>());
  if (!a.evals.empty() || !b.evals.empty()) {
    out["eval"] = compare_evals(a.evals, b.evals);
    const auto& e = out["eval"];
    std::printf("validation A:\n");
    print_eval_summary(e["a"]);
    std::printf("validation B:\n");
    print_eval_summary(e["b"]);
    if (e.contains("eval_loss_rel_diff"))
      std::printf("eval_loss over %lld common evaluations: relative difference %.3e, max |a-b| %.3e at iteration %lld\n",
                  static_cast<long long>(e["common_evaluations"].get<int64_t>()), e["eval_loss_rel_diff"].get<double>(),
                  e["eval_loss_max_abs_diff"].get<double>(),
                  static_cast<long long>(e["eval_loss_max_abs_diff_iteration"].get<int64_t>()));
  }
  if (!plot_path.empty()) {
    draw_figure(compare_figure(a, b, options.skip_first), plot_path);
    std::printf("wrote %s (loss of both, their difference, step times after warm-up)\n", plot_path.c_str());
  }
  std::printf("%s\n", out.dump().c_str());
}

// Without --out, one run's figure goes into its directory, named by its last iteration (a later
// plot of a longer run is a new file; an existing one is never replaced).
std::string default_plot_path(const std::vector<NamedRun>& runs) {
  if (runs.size() != 1) fail("logs plot: --out is required when plotting ", runs.size(), " runs");
  const auto& run = runs[0];
  if (run.records.empty() || !fs::is_directory(run.dir))
    fail("logs plot: --out is required (", run.path, " is not in a run directory with iterations)");
  const auto path = fs::path(run.dir) / format("metrics_iter_%07lld.png", static_cast<long long>(run.records.back().value("iteration", int64_t{0})));
  std::error_code error;
  if (fs::symlink_status(path, error).type() != fs::file_type::not_found)
    fail("logs plot: ", path.string(), " exists (the figure of the same iteration); give --out to draw another");
  return path.string();
}

void logs_plot(const std::vector<std::string>& runs, const RunsPlotOptions& options, const std::string& out) {
  const auto named = read_named_runs(runs);
  const std::string out_path = out.empty() ? default_plot_path(named) : out;
  draw_figure(runs_figure(named, options), out_path);
  std::string names;
  for (const auto& run : named) names += (names.empty() ? "" : ", ") + run.name;
  std::printf("wrote %s (%zu run%s: %s)\n", out_path.c_str(), named.size(), named.size() == 1 ? "" : "s",
              names.c_str());
}

}  // namespace

void add_logs_commands(CLI::App& app, Commands& commands) {
  struct Args {
    std::string a, b, plot;
    std::vector<std::string> runs;
    LogStatsOptions stats;
    RunsPlotOptions figure;
  };
  auto o = std::make_shared<Args>();
  auto* logs = app.add_subcommand("logs", "training logs: metrics.jsonl or Megatron-style console lines (docs/tools.md)");
  logs->require_subcommand(1);
  auto* parse = logs->add_subcommand("parse", "print one normalized JSON record per iteration");
  parse->add_option("file", o->a, "log file or a run's output directory")->required();
  auto* summary = logs->add_subcommand("summary", "one run: steady-state step time, throughput, MFU, loss");
  summary->add_option("file", o->a, "log file or a run's output directory")->required();
  summary->add_option("--skip-first,--skip_first", o->stats.skip_first, "warm-up iterations left out")->capture_default_str();
  auto* compare = logs->add_subcommand("compare", "loss agreement, step time and throughput of two runs");
  compare->add_option("a", o->a, "run A: a log file or a run's output directory")->required();
  compare->add_option("b", o->b, "run B (the reference)")->required();
  compare->add_option("--skip-first,--skip_first", o->stats.skip_first, "warm-up iterations left out of step times")
      ->capture_default_str();
  compare->add_option("--window", o->stats.window, "also average the last W iterations (0: off)")->capture_default_str();
  compare->add_option("--plot", o->plot, "also draw both losses, their difference and the step times (.png/.svg/.pdf)");
  auto* plot = logs->add_subcommand("plot", "draw loss, grad norm, lr, step time, MFU and memory of runs");
  plot->add_option("runs", o->runs, "runs: [NAME=]metrics.jsonl, a console log or a run's output directory")
      ->required();
  plot->add_option("--out", o->plot, "figure file (.png, .svg or .pdf); default for one run: "
                   "<run dir>/metrics_iter_<last iteration>.png");
  plot->add_option("--smoothing", o->figure.smoothing, "EMA weight of the smoothed loss, in [0, 1)")
      ->capture_default_str();
  plot->add_option("--skip-first,--skip_first", o->figure.skip_first, "warm-up iterations drawn dotted")
      ->capture_default_str();
  plot->add_option("--title", o->figure.title, "figure title");
  commands.add(parse, [o] { logs_parse(run_log_path(o->a)); });
  commands.add(summary, [o] { logs_summary(run_log_path(o->a), o->stats); });
  commands.add(compare, [o] { logs_compare(o->a, o->b, o->stats, o->plot); });
  commands.add(plot, [o] { logs_plot(o->runs, o->figure, o->plot); });
}

}  // namespace mmtrain
