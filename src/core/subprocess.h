// Running another program and waiting for it: the plotter (python + matplotlib) and the runs of
// `mmtrain ablate` (torchrun or mmtrain itself).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

struct ProcessOptions {
  std::string stdin_text;   // written to the child's stdin, which is then closed (nothing: /dev/null)
  std::string stdin_path;   // or: the child's stdin is this file (it must exist); then stdin_text is unused
  std::string output_path;  // stdout and stderr both go to this file (empty: inherit ours)
  std::string stderr_path;  // with output_path: stderr goes here instead (a fresh file, as output_path)
  // > 0: the child runs in a process group of its own, killed (SIGKILL, the whole group) this many
  // seconds after stdin_text is written (give a large input as stdin_path); run_process then returns
  // kTimedOutStatus.
  double timeout_s = 0;
  std::vector<std::pair<std::string, std::string>> environment;  // added to (or replacing in) ours
};

// What run_process returns for a child killed at its timeout (as timeout(1) exits).
inline constexpr int kTimedOutStatus = 124;

// Runs argv (argv[0] looked up in PATH) and returns its exit status; a signal death returns
// 128 + the signal, as a shell reports it. Fails only when the program cannot be started.
int run_process(const std::vector<std::string>& argv, const ProcessOptions& options = {});

// The directory of the running executable (/proc/self/exe), for files installed beside it.
std::string executable_dir();

}  // namespace mmtrain
