// The ablation table from hand-made runs: loss differences, memory and step-time changes, the
// noise floors of control repeats and the inside / outside marks.
#include "analysis/ablate.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mmtrain {
namespace {

// A run of `losses.size()` iterations with the given step times and allocated / RSS peaks.
AblationArm arm(const std::string& name, const std::vector<double>& losses, const std::vector<double>& step_ms,
                double allocated_mb, double rss_mb) {
  AblationArm a;
  a.name = name;
  for (size_t i = 0; i < losses.size(); ++i) {
    LogRecord r = {{"iteration", static_cast<int64_t>(i + 1)},
                   {"loss", losses[i]},
                   {"step_time_ms", step_ms[i]},
                   {"peak_rss_mb", rss_mb}};
    // The first iteration's peak is larger (warm-up): the table must leave it out. The third
    // iteration's is smaller (communication overlapping less): the largest counts.
    r["memory"] = {{"step_peak_mb", i == 0 ? allocated_mb * 3 : i == 2 ? allocated_mb - 10 : allocated_mb}};
    a.records.push_back(std::move(r));
  }
  return a;
}

const std::vector<double> kLoss = {4.0, 3.0, 2.0, 1.0};
const std::vector<double> kTimes = {500, 100, 102, 98};

TEST(Ablate, TableAgainstControlRepeats) {
  const auto control = arm("control", kLoss, kTimes, 200, 400);                       // median 100
  const auto repeat1 = arm("control_repeat_1", kLoss, {400, 103, 105, 101}, 200, 402);  // median 103
  const auto repeat2 = arm("control_repeat_2", kLoss, {400, 99, 97, 101}, 200.5, 398);  // median 99
  const auto same = arm("does_nothing", kLoss, {450, 104.5, 106, 103}, 200, 401);       // median 104.5
  const auto slower = arm("recompute", kLoss, {480, 130, 128, 131}, 150, 380);
  const auto other = arm("lr", {4.0, 3.5, 2.5, 2.0}, kTimes, 200, 400);
  const auto t = ablation_table({control, repeat1, repeat2}, {same, slower, other}, 1);

  EXPECT_EQ(t["steps"], 4);
  EXPECT_DOUBLE_EQ(t["control"]["allocated_peak_mb"].get<double>(), 200.0);  // the largest of 200, 190, 200
  EXPECT_DOUBLE_EQ(t["control"]["allocated_least_mb"].get<double>(), 190.0);
  EXPECT_DOUBLE_EQ(t["control"]["step_time_ms"].get<double>(), 302.0 / 3);  // mean of the medians 100, 103, 99
  EXPECT_EQ(t["control_repeats"].size(), 2u);
  const auto& noise = t["noise"];
  EXPECT_DOUBLE_EQ(noise["loss_rel_diff"].get<double>(), 0.0);
  // The repeats' largest change, 0.25 %, is below the 1 MiB band, of 200 MiB.
  EXPECT_DOUBLE_EQ(noise["allocated_change_pct"].get<double>(), 0.5);
  EXPECT_TRUE(noise["rss_change_pct"].is_null());  // reported, not judged
  // Medians 100, 103, 99: mean 100.667, sd 2.0817; t(0.975, 2) = 4.303; x sqrt(1 + 1/3).
  const double mean_ms = 302.0 / 3, sd = std::sqrt(((100 - mean_ms) * (100 - mean_ms) + (103 - mean_ms) * (103 - mean_ms) +
                                                    (99 - mean_ms) * (99 - mean_ms)) / 2);
  EXPECT_NEAR(noise["step_time_change_pct"].get<double>(), 100 * 4.303 * sd * std::sqrt(4.0 / 3) / mean_ms, 1e-9);

  const auto& f = t["features"];
  ASSERT_EQ(f.size(), 3u);
  // 104.5 ms is 3.8 % above the control's 100.67: inside the prediction interval (10.3 %).
  EXPECT_EQ(f[0]["name"], "does_nothing");
  for (const char* key : {"loss_rel_diff", "allocated_change_pct", "step_time_change_pct"})
    EXPECT_TRUE(f[0]["inside_noise"][key].get<bool>()) << key;
  EXPECT_TRUE(f[0]["inside_noise"]["rss_change_pct"].is_null());
  EXPECT_DOUBLE_EQ(f[0]["rss_change_pct"].get<double>(), 0.25);

  EXPECT_DOUBLE_EQ(f[1]["allocated_change_pct"].get<double>(), -25.0);
  EXPECT_NEAR(f[1]["step_time_change_pct"].get<double>(), 100 * (130 - mean_ms) / mean_ms, 1e-9);
  EXPECT_TRUE(f[1]["inside_noise"]["loss_rel_diff"].get<bool>());
  EXPECT_FALSE(f[1]["inside_noise"]["allocated_change_pct"].get<bool>());
  EXPECT_DOUBLE_EQ(f[1]["rss_change_pct"].get<double>(), -5.0);
  EXPECT_FALSE(f[1]["inside_noise"]["step_time_change_pct"].get<bool>());

  // sum |a-b| / sum |b| = (0 + 0.5 + 0.5 + 1) / 10.
  EXPECT_DOUBLE_EQ(f[2]["loss_rel_diff"].get<double>(), 0.2);
  EXPECT_FALSE(f[2]["inside_noise"]["loss_rel_diff"].get<bool>());

  const auto md = ablation_markdown(t);
  EXPECT_NE(md.find("| recompute |"), std::string::npos) << md;
  EXPECT_NE(md.find("150.0 MiB (-25.00 %) **(outside)**"), std::string::npos) << md;
  EXPECT_NE(md.find("2.00e-01 **(outside)**"), std::string::npos) << md;
  EXPECT_NE(md.find("Noise floor (the control and 2 repeats, median step 100.0, 103.0, 99.0 ms)"), std::string::npos)
      << md;
}

// Many steps make the within-run band tight; the floor still covers the run-to-run spread.
TEST(Ablate, TheStepFloorIsAtLeastTheWithinRunBand) {
  const auto control = arm("control", kLoss, {500, 90, 110, 100}, 200, 400);  // median 100, sd 10
  const auto repeat = arm("control_repeat_1", kLoss, {500, 90, 110, 100}, 200, 400);
  const auto t = ablation_table({control, repeat}, {arm("x", kLoss, kTimes, 200, 400)}, 1);
  // Identical repeats: no spread between runs, so 2 * 1.2533 * 10 * sqrt(2/3) %.
  EXPECT_NEAR(t["noise"]["step_time_change_pct"].get<double>(), 2 * 1.2533 * 10 * std::sqrt(2.0 / 3.0), 1e-9);
}

TEST(Ablate, WithoutARepeatNothingIsJudged) {
  const auto t = ablation_table({arm("control", kLoss, kTimes, 200, 400)}, {arm("x", kLoss, kTimes, 100, 400)}, 1);
  EXPECT_TRUE(t["noise"]["loss_rel_diff"].is_null());
  EXPECT_TRUE(t["features"][0]["inside_noise"]["allocated_change_pct"].is_null());
  EXPECT_NE(ablation_markdown(t).find("--control-repeats 3"), std::string::npos);
}

TEST(Ablate, FeatureArguments) {
  const auto f = parse_ablation_feature("no_recompute:features.recompute=false, training.lr=1e-3");
  EXPECT_EQ(f.name, "no_recompute");
  EXPECT_EQ(f.overrides, (std::vector<std::string>{"features.recompute=false", "training.lr=1e-3"}));
  EXPECT_THROW(parse_ablation_feature("features.recompute=false"), Error);  // no NAME:
  EXPECT_THROW(parse_ablation_feature("x:features.recompute"), Error);      // no =VALUE
  EXPECT_THROW(parse_ablation_feature("control:a=b"), Error);               // the control's name
  EXPECT_THROW(parse_ablation_feature("control_repeat_2:a=b"), Error);      // a repeat's
  EXPECT_THROW(parse_ablation_feature("a b:a=b"), Error);                   // not a directory name
}

TEST(Ablate, ARunWithoutCommonIterationsIsAnError) {
  auto late = arm("late", kLoss, kTimes, 200, 400);
  for (auto& r : late.records) r["iteration"] = r["iteration"].get<int64_t>() + 10;
  EXPECT_THROW(ablation_table({arm("control", kLoss, kTimes, 200, 400)}, {late}, 1), Error);
}

}  // namespace
}  // namespace mmtrain
