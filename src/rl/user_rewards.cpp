#include "rl/user_rewards.h"

#include "cli/python_runner.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/scratch_dir.h"
#include "core/subprocess.h"
#include "core/text.h"
#include "io/user_file.h"

#include <cmath>
#include <filesystem>
#include <sstream>

namespace mmtrain::rl {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxRewardOutputBytes = int64_t{64} << 20;
constexpr size_t kMessageTail = 2000;  // of what a failed reward printed

// The batch as the reward's input file, one JSON object a completion: scratch/input.jsonl.
std::string write_input(const ScratchDir& scratch, const std::vector<RewardInput>& batch) {
  std::string lines;
  for (const auto& in : batch)
    lines += nlohmann::json({{"prompt", in.prompt},
                             {"completion", in.completion},
                             {"completion_ids", in.completion_ids},
                             {"truncated", in.truncated},
                             {"fields", in.fields.is_object() ? in.fields : nlohmann::json::object()}})
                 .dump() +
             "\n";
  const std::string path = scratch.path() + "/input.jsonl";
  write_file_no_follow(path, lines, "a reward's input");
  return path;
}

std::string tail_of(const std::string& path) {
  const auto text = read_run_file(path, "a reward's output", kMaxRewardOutputBytes);
  if (!text) return "";
  const std::string t = trim(*text);
  return t.size() > kMessageTail ? "..." + t.substr(t.size() - kMessageTail) : t;
}

// One reward value from a JSON value: a number, or an object's "reward" number; finite.
double reward_value(const nlohmann::json& value, const std::string& who, size_t index) {
  const nlohmann::json& number = value.is_object() && value.contains("reward") ? value.at("reward") : value;
  if (!number.is_number())
    fail(who, ": completion ", index, "'s reward is ", number.dump().substr(0, 80), ", not a number");
  const double r = number.get<double>();
  if (!std::isfinite(r)) fail(who, ": completion ", index, "'s reward is ", r, " (not finite)");
  return r;
}

void check_status(int status, const std::string& who, double timeout_s, const std::string& log) {
  if (status == kTimedOutStatus)
    fail(who, " did not finish within training.grpo.reward_timeout_s = ", timeout_s, " s (killed)");
  if (status == 127) fail(who, " could not be started: ", tail_of(log));
  if (status != 0) fail(who, " failed (exit status ", status, "): ", tail_of(log));
}

class PythonReward : public Reward {
 public:
  PythonReward(std::string name, std::vector<std::string> path, double timeout_s)
      : Reward(std::move(name)), path_(std::move(path)), timeout_s_(timeout_s) {}

  std::vector<double> score(const std::vector<RewardInput>& batch) const override {
    const std::string who = "reward " + name() + " (Python, " + std::to_string(batch.size()) + " completions)";
    ScratchDir scratch(fs::temp_directory_path().string(), "mmtrain-reward-");
    const std::string input = write_input(scratch, batch), output = scratch.path() + "/rewards.json",
                      log = scratch.path() + "/log.txt";
    std::vector<std::string> args = {"-m", "mmtrain_py.rewards", "--function", name(), "--input", input, "--output", output};
    for (const auto& dir : path_) args.insert(args.end(), {"--path", fs::absolute(dir).string()});
    ProcessOptions options;
    options.output_path = log;
    options.timeout_s = timeout_s_;
    options.environment = {{"PYTHONPATH", python_package_dir()}};
    check_status(run_python(args, options), who, timeout_s_, log);
    const auto values = json_parse_checked(read_user_file(output, "a reward's output", kMaxRewardOutputBytes), output);
    if (!values.is_array() || values.size() != batch.size())
      fail(who, " returned ", values.is_array() ? std::to_string(values.size()) + " values" : values.type_name(),
           " for ", batch.size(), " completions (one number each)");
    std::vector<double> out;
    for (size_t i = 0; i < values.size(); ++i) out.push_back(reward_value(values[i], who, i));
    return out;
  }

 private:
  std::vector<std::string> path_;
  double timeout_s_;
};

class CommandReward : public Reward {
 public:
  CommandReward(std::vector<std::string> argv, double timeout_s)
      : Reward("command"), argv_(std::move(argv)), timeout_s_(timeout_s) {}

  std::vector<double> score(const std::vector<RewardInput>& batch) const override {
    const std::string who = "reward command (" + argv_.front() + ", " + std::to_string(batch.size()) + " completions)";
    ScratchDir scratch(fs::temp_directory_path().string(), "mmtrain-reward-");
    const std::string input = write_input(scratch, batch), output = scratch.path() + "/output.jsonl",
                      errors = scratch.path() + "/stderr.txt";
    ProcessOptions options;
    options.stdin_path = input;
    options.output_path = output;
    options.stderr_path = errors;
    options.timeout_s = timeout_s_;
    check_status(run_process(argv_, options), who, timeout_s_, errors);
    std::istringstream text(read_user_file(output, "a reward's output", kMaxRewardOutputBytes));
    std::vector<double> out;
    for (std::string line; std::getline(text, line);) {
      if (trim(line).empty()) continue;
      nlohmann::json value;
      try {
        value = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        fail(who, ": output line ", out.size() + 1, " is not JSON: ", line.substr(0, 80));
      }
      out.push_back(reward_value(value, who, out.size()));
    }
    if (out.size() != batch.size())
      fail(who, " wrote ", out.size(), " rewards for ", batch.size(), " completions (one line each)");
    return out;
  }

 private:
  std::vector<std::string> argv_;
  double timeout_s_;
};

}  // namespace

std::unique_ptr<Reward> make_python_reward(const std::string& module_function, const std::vector<std::string>& python_path,
                                           double timeout_s) {
  return std::make_unique<PythonReward>(module_function, python_path, timeout_s);
}

std::unique_ptr<Reward> make_command_reward(const std::vector<std::string>& argv, double timeout_s) {
  if (argv.empty()) fail("training.grpo.reward_command: empty (the program and its arguments)");
  return std::make_unique<CommandReward>(argv, timeout_s);
}

}  // namespace mmtrain::rl
