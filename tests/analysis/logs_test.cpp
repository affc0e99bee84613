// Log parsing and comparison: Megatron/MindSpeed console lines, mmtrain's own
// console line and metrics.jsonl (produced here by the real MetricsLog), and the statistics.
#include "analysis/logs.h"
#include "checkpoint/checkpoint_test_util.h"
#include "core/error.h"
#include "record/metrics.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace mmtrain {
namespace {

std::vector<LogRecord> parse(const std::string& text) {
  std::istringstream in(text);
  return parse_training_log(in, "test.log");
}

const char* kMegatron =
    "[2025-07-20 10:00:00] building model ...\n"
    " [2025-07-20 10:00:07] iteration        1/    5000 | consumed samples:            8 | elapsed time per iteration "
    "(ms): 9123.4 | learning rate: 1.000000E-07 | global batch size:     8 | loss: 7.227000E+00 | grad norm: 3.210 | "
    "number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    " [2025-07-20 10:00:12] iteration        2/    5000 | consumed samples:           16 | elapsed time per iteration "
    "(ms): 4638.1 | learning rate: 2.000000E-07 | global batch size:     8 | lm loss: 7.100000E+00 | loss scale: 1.0 | "
    "grad norm: 2.900 | throughput per GPU (TFLOP/s/GPU): 71.7 |\n"
    "some unrelated line mentioning iteration counts\n"
    " [2025-07-20 10:00:16] iteration        3/    5000 | consumed samples:           24 | elapsed time per iteration "
    "(ms): 4634.8 | learning rate: 3.000000E-07 | global batch size:     8 | video loss: 3.5 | audio loss: 3.4 | "
    "grad norm: nan | MFU: 25.63 % |\n";

TEST(Logs, MegatronLines) {
  const auto r = parse(kMegatron);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0]["iteration"], 1);
  EXPECT_EQ(r[0]["train_iters"], 5000);
  EXPECT_EQ(r[0]["consumed_samples"], 8);
  EXPECT_DOUBLE_EQ(r[0]["step_time_ms"].get<double>(), 9123.4);
  EXPECT_DOUBLE_EQ(r[0]["lr"].get<double>(), 1e-7);
  EXPECT_EQ(r[0]["global_batch_size"], 8);
  EXPECT_DOUBLE_EQ(r[0]["loss"].get<double>(), 7.227);
  EXPECT_DOUBLE_EQ(r[0]["grad_norm"].get<double>(), 3.21);
  EXPECT_EQ(r[0]["number_of_skipped_iterations"], 0);
  // Megatron's "lm loss" is the loss when there is no plain "loss"; "loss scale" is not a loss.
  EXPECT_DOUBLE_EQ(r[1]["loss"].get<double>(), 7.1);
  EXPECT_DOUBLE_EQ(r[1]["loss_scale"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r[1]["tflops_per_device"].get<double>(), 71.7);
  // Several loss terms and no total: the first one; NaN becomes null; MFU percent -> fraction.
  EXPECT_DOUBLE_EQ(r[2]["video_loss"].get<double>(), 3.5);
  EXPECT_DOUBLE_EQ(r[2]["loss"].get<double>(), 3.5);
  EXPECT_TRUE(r[2]["grad_norm"].is_null());
  EXPECT_DOUBLE_EQ(r[2]["mfu"].get<double>(), 0.2563);
  EXPECT_FALSE(parse_log_line("iteration counts are logged below").has_value());
  EXPECT_FALSE(parse_log_line("[mmtrain] rank 0 holds params 1.00 MiB").has_value());
}

TEST(Logs, MmtrainConsoleLineAndMetricsJsonlAgree) {
  testing::TempDir dir;
  ::testing::internal::CaptureStdout();
  {
    MetricsLog log(dir.str(), /*is_writer=*/true, /*progress=*/false);
    for (int i = 1; i <= 3; ++i) {
      StepRecord step;
      step.iteration = i;
      step.consumed_samples = 8 * i;
      step.global_batch_size = 8;
      step.loss = 4.0 / i;
      step.grad_norm = 0.5;
      step.lr = 3e-4;
      step.step_time_ms = 100.0 + i;
      step.tokens = 512;
      step.peak_rss_mb = 10.0;
      step.tflops_per_device = 0.125;
      step.mfu = 0.25;
      log.record(step, 3);
    }
  }
  const auto console = parse(::testing::internal::GetCapturedStdout());
  std::ifstream jsonl(dir / "metrics.jsonl");
  const auto records = parse_training_log(jsonl, "metrics.jsonl");
  ASSERT_EQ(console.size(), 3u);
  ASSERT_EQ(records.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(console[i]["iteration"], records[i]["iteration"]);
    EXPECT_EQ(console[i]["train_iters"], 3);
    EXPECT_EQ(console[i]["consumed_samples"], records[i]["consumed_samples"]);
    EXPECT_NEAR(console[i]["loss"].get<double>(), records[i]["loss"].get<double>(), 1e-6);
    EXPECT_NEAR(console[i]["step_time_ms"].get<double>(), records[i]["step_time_ms"].get<double>(), 0.05);
    EXPECT_NEAR(console[i]["tflops_per_device"].get<double>(), 0.125, 1e-9);
    EXPECT_NEAR(console[i]["mfu"].get<double>(), 0.25, 1e-9);
  }
  EXPECT_EQ(records[0]["tokens"], 512);
}

TEST(Logs, LaterRecordOfAnIterationWins) {
  // A resumed run appends iterations 2..3 again; a JSON line and a console line may mix.
  const auto r = parse(
      "{\"iteration\": 1, \"loss\": 1.0}\n{\"iteration\": 2, \"loss\": 2.0}\n"
      "iteration 2/3 | loss: 2.5 |\n{\"iteration\": 3, \"loss\": 3.0}\n{\"note\": \"no iteration\"}\n");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r[1]["loss"].get<double>(), 2.5);
  EXPECT_THROW(parse("{\"iteration\": 1, \"loss\": \n"), Error);
  testing::TempDir dir;
  std::ofstream(dir / "empty.log") << "nothing here\n";
  EXPECT_THROW(parse_training_log_file(dir / "empty.log"), Error);
  EXPECT_THROW(parse_training_log_file(dir / "missing.log"), Error);
}

std::vector<LogRecord> run(const std::vector<double>& losses, const std::vector<double>& step_ms) {
  std::vector<LogRecord> out;
  for (size_t i = 0; i < losses.size(); ++i)
    out.push_back({{"iteration", i + 1}, {"loss", losses[i]}, {"step_time_ms", step_ms[i]}, {"global_batch_size", 8}});
  return out;
}

TEST(Logs, SummaryStatistics) {
  const auto r = run({4, 3, 2, 1, 0}, {900, 100, 110, 120, 130});
  const auto s = log_summary(r, {1, 2});
  EXPECT_EQ(s["skipped_warmup"], 1);
  EXPECT_DOUBLE_EQ(s["step_time_ms"]["median"].get<double>(), 115.0);
  EXPECT_DOUBLE_EQ(s["step_time_ms"]["mean"].get<double>(), 115.0);
  EXPECT_DOUBLE_EQ(s["step_time_ms"]["p95"].get<double>(), 128.5);  // numpy's linear percentile
  EXPECT_DOUBLE_EQ(s["samples_per_s"].get<double>(), 8 / 0.115);
  EXPECT_DOUBLE_EQ(s["loss_mean"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(s["loss_last"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(s["last_window"]["loss_mean"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["last_window"]["step_time_ms_mean"].get<double>(), 125.0);
  // skip_first larger than the run keeps the last record.
  EXPECT_EQ(log_summary(r, {100, 0})["step_time_ms"]["count"], 1);
}

TEST(Logs, CompareTwoRuns) {
  auto a = run({4, 3, 2, 1}, {500, 100, 100, 100});
  const auto b = run({4, 3.5, 2, 1, 0.5}, {500, 200, 200, 200, 200});
  const auto c = compare_training_logs(a, b, {1, 2});
  EXPECT_EQ(c["common_iterations"], 4);
  EXPECT_DOUBLE_EQ(c["loss_rel_diff"].get<double>(), 0.5 / 10.5);  // Σ|a-b| / Σ|b| over iterations 1..4
  EXPECT_DOUBLE_EQ(c["loss_max_abs_diff"].get<double>(), 0.5);
  EXPECT_EQ(c["loss_max_abs_diff_iteration"], 2);
  EXPECT_DOUBLE_EQ(c["last_window"]["loss_rel_diff"].get<double>(), 0.0);  // iterations 3..4
  EXPECT_DOUBLE_EQ(c["step_time_ratio"].get<double>(), 0.5);
  EXPECT_EQ(c["a"]["iterations"], 4);
  EXPECT_EQ(c["b"]["iterations"], 5);
  a[1]["loss"] = nullptr;  // a NaN loss drops out of the comparison
  EXPECT_EQ(compare_training_logs(a, b, {1, 0})["common_iterations"], 3);
}

}  // namespace
}  // namespace mmtrain
