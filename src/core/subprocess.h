// Running another program and waiting for it: the plotter (python + matplotlib) and the runs of
// `mmtrain ablate` (torchrun or mmtrain itself).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

struct ProcessOptions {
  std::string stdin_text;   // written to the child's stdin, which is then closed (nothing: /dev/null)
  std::string output_path;  // stdout and stderr both go to this file (empty: inherit ours)
  std::vector<std::pair<std::string, std::string>> environment;  // added to (or replacing in) ours
};

// Runs argv (argv[0] looked up in PATH) and returns its exit status; a signal death returns
// 128 + the signal, as a shell reports it. Fails only when the program cannot be started.
int run_process(const std::vector<std::string>& argv, const ProcessOptions& options = {});

// The directory of the running executable (/proc/self/exe), for files installed beside it.
std::string executable_dir();

}  // namespace mmtrain
