#include "record/metrics.h"

#include "core/config_schema.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/text.h"
#include "io/atomic_file.h"
#include "io/user_file.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace mmtrain {

MetricsLog::MetricsLog(const std::string& output_dir, bool is_writer, bool progress, bool tensorboard)
    : is_writer_(is_writer), progress_(progress && isatty(STDOUT_FILENO)) {
  if (!is_writer_) return;
  std::filesystem::create_directories(output_dir);
  const auto path = output_dir + "/metrics.jsonl";
  file_ = open_append_no_follow(path, "metrics.jsonl");
  if (tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(output_dir + "/tensorboard");
}

namespace {

// A step's record as TensorBoard scalars: the metrics.jsonl keys, phases as "phases_ms/<phase>".
std::vector<std::pair<std::string, double>> tensorboard_scalars(const StepRecord& step) {
  std::vector<std::pair<std::string, double>> out = {{"loss", step.loss},
                                                     {"grad_norm", step.grad_norm},
                                                     {"lr", step.lr},
                                                     {"step_time_ms", step.step_time_ms},
                                                     {"tokens", static_cast<double>(step.tokens)},
                                                     {"peak_rss_mb", step.peak_rss_mb}};
  if (step.tflops_per_device) out.emplace_back("tflops_per_device", *step.tflops_per_device);
  if (step.mfu) out.emplace_back("mfu", *step.mfu);
  if (step.checkpoint_stall_ms) out.emplace_back("checkpoint_stall_ms", *step.checkpoint_stall_ms);
  if (step.dp_work_imbalance) out.emplace_back("dp_work_imbalance", *step.dp_work_imbalance);
  if (step.dp_compute_imbalance) out.emplace_back("dp_compute_imbalance", *step.dp_compute_imbalance);
  if (step.dp_work_imbalance_bound) out.emplace_back("dp_work_imbalance_bound", *step.dp_work_imbalance_bound);
  if (step.micro_batches) out.emplace_back("micro_batches", static_cast<double>(*step.micro_batches));
  if (step.budget_fill) out.emplace_back("budget_fill", *step.budget_fill);
  if (step.samples_skipped) out.emplace_back("samples_skipped", static_cast<double>(*step.samples_skipped));
  if (step.predicted_step_time_ms) out.emplace_back("predicted_step_time_ms", *step.predicted_step_time_ms);
  if (step.predicted_peak_rss_mb) out.emplace_back("predicted_peak_rss_mb", *step.predicted_peak_rss_mb);
  if (step.peak_device_allocated_mb) out.emplace_back("peak_device_allocated_mb", *step.peak_device_allocated_mb);
  if (step.peak_device_reserved_mb) out.emplace_back("peak_device_reserved_mb", *step.peak_device_reserved_mb);
  if (step.predicted_peak_device_mb) out.emplace_back("predicted_peak_device_mb", *step.predicted_peak_device_mb);
  if (step.offload.is_object())
    for (const auto& [tier, counters] : step.offload.items())
      for (const auto& [name, value] : counters.items())
        if (value.is_number()) out.emplace_back("offload/" + tier + "/" + name, value.get<double>());
  if (step.objective.is_object())  // TRL's names, "rewards/chosen" ...: TensorBoard groups them as TRL's do
    for (const auto& [name, value] : step.objective.items())
      if (value.is_number()) out.emplace_back(name, value.get<double>());
  for (const auto& [group, phases] : {std::pair<const char*, const nlohmann::json*>{"phases_ms", &step.phases_ms},
                                       {"phases_max_ms", &step.phases_max_ms}})
    if (phases->is_object())
      for (const auto& [phase, ms] : phases->items())
        if (ms.is_number()) out.emplace_back(std::string(group) + "/" + phase, ms.get<double>());
  return out;
}

}  // namespace

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::record(const StepRecord& step, int64_t train_iters) {
  if (!is_writer_) return;
  const auto line = step.to_json().dump();
  std::fprintf(file_, "%s\n", line.c_str());
  std::fflush(file_);
  if (tensorboard_) tensorboard_->scalars(step.iteration, tensorboard_scalars(step));
  char text[512];
  int n = std::snprintf(text, sizeof(text),
                        " iteration %8lld/%8lld | consumed samples: %10lld | elapsed time per iteration (ms): %.1f"
                        " | learning rate: %.6E | global batch size: %5lld | loss: %.6E | grad norm: %.4f",
                        static_cast<long long>(step.iteration), static_cast<long long>(train_iters),
                        static_cast<long long>(step.consumed_samples), step.step_time_ms, step.lr,
                        static_cast<long long>(step.global_batch_size), step.loss, step.grad_norm);
  if (step.tflops_per_device)
    n += std::snprintf(text + n, sizeof(text) - n, " | TFLOP/s per device: %.3f", *step.tflops_per_device);
  if (step.mfu) n += std::snprintf(text + n, sizeof(text) - n, " | MFU: %.2f %%", 100.0 * *step.mfu);
  if (step.objective.contains("rewards/accuracies"))
    n += std::snprintf(text + n, sizeof(text) - n, " | reward accuracy: %.3f | reward margin: %.4f",
                       step.objective["rewards/accuracies"].get<double>(), step.objective["rewards/margins"].get<double>());
  if (step.objective.contains("reward") && step.objective.contains("completions/mean_length"))  // GRPO
    n += std::snprintf(text + n, sizeof(text) - n, " | reward: %.4f | completion length: %.1f",
                       step.objective["reward"].get<double>(), step.objective["completions/mean_length"].get<double>());
  if (step.objective.contains("kl"))
    n += std::snprintf(text + n, sizeof(text) - n, " | kl: %.4g", step.objective["kl"].get<double>());
  std::printf("%s", text);
  ++recorded_;
  elapsed_ms_ += step.step_time_ms;
  if (progress_) {
    const double remaining = (train_iters - step.iteration) * elapsed_ms_ / recorded_ / 1000.0;
    std::printf(" | ETA %.0f s", remaining);
  }
  std::printf("\n");
  std::fflush(stdout);
}

void MetricsLog::record(const EvalRecord& eval) {
  if (!is_writer_) return;
  std::fprintf(file_, "%s\n", eval.to_json().dump().c_str());
  std::fflush(file_);
  std::vector<std::pair<std::string, double>> scalars = {{"eval/loss", eval.loss}, {"eval/time_ms", eval.time_ms}};
  for (const auto& [name, value] : eval.terms) scalars.emplace_back("eval/loss_" + name, value);
  for (const auto& [name, value] : eval.timesteps) scalars.emplace_back("eval/loss_" + name, value);
  if (eval.ppl) scalars.emplace_back("eval/ppl", *eval.ppl);
  if (eval.objective.is_object())
    for (const auto& [name, value] : eval.objective.items())
      if (value.is_number()) scalars.emplace_back("eval/" + name, value.get<double>());
  if (eval.ema.is_object())  // training.eval_with_ema: eval_ema/loss, ...
    for (const auto& [name, value] : eval.ema.items())
      if (name.rfind("eval_", 0) == 0 && value.is_number()) scalars.emplace_back("eval_ema/" + name.substr(5), value.get<double>());
  if (tensorboard_) tensorboard_->scalars(eval.iteration, scalars);
  std::string line = format(" evaluation after iteration %8lld | eval loss: %.6E", static_cast<long long>(eval.iteration),
                            eval.loss);
  if (eval.ppl) line += format(" | eval ppl: %.4f", *eval.ppl);
  if (eval.ema.is_object()) line += format(" | eval ema loss: %.6E", eval.ema.at("eval_loss").get<double>());
  if (eval.objective.contains("rewards/accuracies"))
    line += format(" | eval reward accuracy: %.3f", eval.objective["rewards/accuracies"].get<double>());
  for (const auto& [name, value] : eval.terms) line += format(" | %s: %.6E", name.c_str(), value);
  line += format(" | samples: %lld | time (ms): %.1f", static_cast<long long>(eval.samples), eval.time_ms);
  if (!std::isfinite(eval.loss)) line += " | warning: the validation loss is not finite";
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void MetricsLog::record(const SampleRecord& samples) {
  if (!is_writer_) return;
  std::fprintf(file_, "%s\n", samples.to_json().dump().c_str());
  std::fflush(file_);
  if (tensorboard_ && !(samples.images.empty() && samples.audio.empty() && samples.texts.empty()))
    tensorboard_->samples(samples);
  if (samples.error.empty())
    std::printf(" %s iteration %8lld | %s | time (s): %.1f\n", samples.heading.c_str(),
                static_cast<long long>(samples.iteration), samples.dir.c_str(), samples.seconds);
  else
    std::printf(" %s iteration %8lld | failed: %s | time (s): %.1f\n", samples.heading.c_str(),
                static_cast<long long>(samples.iteration), samples.error.c_str(), samples.seconds);
  std::fflush(stdout);
}

namespace {

// The iteration of one metrics.jsonl line; nullopt for a line that is not a record (a crash can
// leave half a line at the end).
std::optional<int64_t> record_iteration(const std::string& line) {
  if (json_nesting_depth(line) > kMaxJsonDepth) return std::nullopt;
  const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("iteration") || !record["iteration"].is_number_integer())
    return std::nullopt;
  return record["iteration"].get<int64_t>();
}

}  // namespace

MetricsOnDisk metrics_on_disk(const std::string& output_dir) {
  MetricsOnDisk out;
  out.path = output_dir + "/metrics.jsonl";
  std::istringstream in(read_run_file(out.path, out.path, kMaxTextFileBytes).value_or(""));
  std::string line;
  while (std::getline(in, line)) {
    const auto iteration = record_iteration(line);
    if (!iteration) continue;
    out.first_iteration = out.records == 0 ? *iteration : std::min(out.first_iteration, *iteration);
    out.last_iteration = std::max(out.last_iteration, *iteration);
    ++out.records;
  }
  return out;
}

int64_t metrics_keep_through(const std::string& output_dir, int64_t iteration) {
  const auto path = output_dir + "/metrics.jsonl";
  const auto content = read_run_file(path, path, kMaxTextFileBytes);
  if (!content) return 0;
  std::istringstream in(*content);
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const auto at = record_iteration(line);
    if (at && *at <= iteration) {
      kept += line + "\n";
    } else {
      ++dropped;
    }
  }
  if (dropped > 0) file_write_atomic(path, kept);
  return dropped;
}

namespace {

// A "Vm...:" line of /proc/self/status, in MB.
double proc_status_mb(const std::string& wanted) {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == wanted) {
      double kb = 0;
      status >> kb;
      return kb / 1024.0;
    }
    std::getline(status, key);
  }
  return 0.0;
}

}  // namespace

double peak_rss_mb() { return proc_status_mb("VmHWM:"); }
double current_rss_mb() { return proc_status_mb("VmRSS:"); }

}  // namespace mmtrain
