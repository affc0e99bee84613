// The built-in rewards (rl/rewards.h) one completion at a time, DAPO's overlong penalty against
// TRL's get_soft_overlong_punishment's values (written out here), and a user command's time limit.
#include "rl/rewards.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <chrono>

namespace mmtrain::rl {
namespace {

RewardInput completion(const std::string& text, int64_t tokens, nlohmann::json fields = nlohmann::json::object()) {
  RewardInput in;
  in.prompt = "How many?";
  in.completion = text;
  in.completion_ids.assign(static_cast<size_t>(tokens), 7);
  in.fields = std::move(fields);
  return in;
}

std::vector<double> score(const GrpoConfig& config, const std::vector<RewardInput>& batch) {
  const auto rewards = make_rewards(config);
  EXPECT_EQ(rewards.size(), 1u);
  return rewards.at(0)->score(batch);
}

TEST(Rewards, AnswerMatchByTextOrNumber) {
  GrpoConfig c;
  c.reward_funcs = {"answer_match"};
  const nlohmann::json half = {{"answer", "1/2"}}, red = {{"answer", "Red"}}, three = {{"answer", 3}};
  EXPECT_EQ(score(c, {completion("[THINK]hm[/THINK]\\boxed{0.5}", 9, half), completion("0.6", 1, half),
                      completion("red.", 1, red), completion("3", 1, three), completion("[THINK]3[/THINK]4", 5, three)}),
            (std::vector<double>{1, 0, 1, 1, 0}));
  c.reward_funcs = {"exact_match"};
  EXPECT_EQ(score(c, {completion(" Red ", 1, red), completion("red", 1, red)}), (std::vector<double>{1, 0}));
  c.reward_funcs = {"numeric_match"};
  EXPECT_EQ(score(c, {completion("\\frac{2}{4}", 1, half), completion("one half", 1, half)}), (std::vector<double>{1, 0}));
}

TEST(Rewards, AnAnswerRewardNamesAPromptWithoutTheField) {
  GrpoConfig c;
  c.reward_funcs = {"answer_match"};
  c.answer_field = "solution";
  EXPECT_THROW(
      {
        try {
          score(c, {completion("3", 1, {{"answer", "3"}})});
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("no field 'solution'"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

TEST(Rewards, RegexAndThinkFormat) {
  GrpoConfig c;
  c.reward_funcs = {"regex_match"};
  c.reward_regex = "^[0-9]+$";
  EXPECT_EQ(score(c, {completion("123", 1), completion("12a", 1)}), (std::vector<double>{1, 0}));
  c.reward_funcs = {"think_format"};
  EXPECT_EQ(score(c, {completion("[THINK]a[/THINK]b", 1), completion("b", 1)}), (std::vector<double>{1, 0}));
}

TEST(Rewards, OverlongPenaltyIsTrlsSoftPunishment) {
  GrpoConfig c;
  c.reward_funcs = {"overlong_penalty"};
  c.max_completion_length = 10;
  c.overlong_buffer = 4;
  std::vector<RewardInput> batch;
  for (int64_t n : {3, 6, 7, 8, 10, 11}) batch.push_back(completion("x", n));
  // get_soft_overlong_punishment(10, 4) on those lengths: 0 up to 6, then (6 - n) / 4, -1 past 10.
  EXPECT_EQ(score(c, batch), (std::vector<double>{0, 0, -0.25, -0.5, -1, -1}));
}

TEST(Rewards, ACommandThatHangsIsKilledAtItsLimit) {
  GrpoConfig c;
  c.reward_funcs = {"command"};
  c.reward_command = {"sh", "-c", "sleep 30"};
  c.reward_timeout_s = 0.5;
  const auto began = std::chrono::steady_clock::now();
  try {
    score(c, {completion("x", 1)});
    FAIL() << "a hanging command gave rewards";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish within training.grpo.reward_timeout_s = 0.5"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(), 5.0);
}

TEST(Rewards, ACommandsOutputIsCheckedLineByLine) {
  GrpoConfig c;
  c.reward_funcs = {"command"};
  c.reward_command = {"sh", "-c", "cat > /dev/null; echo 1; echo '{\"reward\": 2.5}'"};
  EXPECT_EQ(score(c, {completion("a", 1), completion("b", 1)}), (std::vector<double>{1, 2.5}));
  c.reward_command = {"sh", "-c", "cat > /dev/null; echo 1; echo oops"};
  EXPECT_THROW(score(c, {completion("a", 1), completion("b", 1)}), Error);
  c.reward_command = {"sh", "-c", "cat > /dev/null; echo failing >&2; exit 3"};
  try {
    score(c, {completion("a", 1)});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exit status 3): failing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mmtrain::rl
