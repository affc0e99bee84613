// Rewards users write (training.grpo.reward_funcs), each run in a process of its own with a time
// limit, so that one that raises, hangs or crashes is named and stops the run without hanging its
// ranks (rl/rollout.h agrees on a failure over all ranks before anything collective):
//   "module:function"  a Python function, called by mmtrain_py.rewards as
//                      function(prompts=[...], completions=[...], completion_ids=[...], truncated=[...],
//                               **{field: [...] for each prompt record field}) -> [float, ...]
//                      with reward_python_path's directories first on sys.path (TRL's reward_funcs
//                      signature, its completions as plain strings)
//   "command"          reward_command's program, reading one JSON object per completion on stdin
//                      ({"prompt", "completion", "completion_ids", "truncated", "fields"}) and writing
//                      one line per completion: a number, or {"reward": number}
// Each must give exactly one finite number per completion. docs/grpo.md.
#pragma once
#include "rl/rewards.h"

#include <memory>
#include <string>
#include <vector>

namespace mmtrain::rl {

std::unique_ptr<Reward> make_python_reward(const std::string& module_function, const std::vector<std::string>& python_path,
                                           double timeout_s);
std::unique_ptr<Reward> make_command_reward(const std::vector<std::string>& argv, double timeout_s);

}  // namespace mmtrain::rl
