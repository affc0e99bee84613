// The `tools` section: the seed framework's profiler switches.
//   tools.profile         a Chrome/Perfetto trace per chosen rank through LibTorch's Kineto
//                         profiler (record/profiler.h)
//   tools.memory_profile  per-phase peaks of the tensor memory in use (record/memory_profile.h)
// Steps are 1-based iterations, both ends included.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct ProfileConfig {
  bool enable = false;
  std::vector<int> ranks = {0};  // global ranks that write a trace; [-1]: every rank
  int64_t start_step = 2;        // the first iteration is warm-up: start after it
  int64_t end_step = 3;
  bool record_shapes = false;    // input shapes of every op in the trace
  bool with_memory = false;      // allocation events ([memory] rows) in the trace
  bool with_stack = false;       // refused unless false: the Python frames PyTorch records do not exist here
  std::string save_path;         // directory of the traces; empty: <logging.output_dir>/profile

  static void declare(ConfigSection<ProfileConfig>& section);
};

struct MemoryProfileConfig {
  bool enable = false;
  int64_t start_step = 1;
  int64_t end_step = 0;  // 0: through the last iteration

  static void declare(ConfigSection<MemoryProfileConfig>& section);
};

struct ToolsConfig {
  ProfileConfig profile;
  MemoryProfileConfig memory_profile;

  static void declare(ConfigSection<ToolsConfig>& section);
};

}  // namespace mmtrain
