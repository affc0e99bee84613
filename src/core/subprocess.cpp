#include "core/subprocess.h"

#include "core/error.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <cstring>
#include <filesystem>

namespace mmtrain {

namespace {

// A fresh file of its own for a child's output: whatever is at the name (a stale log, a planted
// symlink) is unlinked, never followed or truncated, and the new one is created exclusively.
int create_output_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) fail("cannot replace ", path, ": ", std::strerror(errno));
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create ", path, " for writing: ", std::strerror(errno));
  return fd;
}

// Waits for pid; past the deadline (timeout_s > 0) kills its process group and returns
// kTimedOutStatus.
int wait_for(pid_t pid, const std::string& program, double timeout_s) {
  int status = 0;
  if (timeout_s <= 0) {
    while (waitpid(pid, &status, 0) < 0)
      if (errno != EINTR) fail("waiting for ", program, ": ", std::strerror(errno));
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (true) {
      const pid_t done = waitpid(pid, &status, WNOHANG);
      if (done == pid) break;
      if (done < 0 && errno != EINTR) fail("waiting for ", program, ": ", std::strerror(errno));
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(-pid, SIGKILL);  // the group: a shell's children too
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        return kTimedOutStatus;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

int run_process(const std::vector<std::string>& argv, const ProcessOptions& options) {
  if (argv.empty()) fail("run_process: no program given");
  int input[2] = {-1, -1};
  if (pipe(input) != 0) fail("cannot create a pipe for ", argv[0], ": ", std::strerror(errno));
  int input_file = -1;
  if (!options.stdin_path.empty()) {
    input_file = open(options.stdin_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (input_file < 0) fail("cannot open ", options.stdin_path, " for ", argv[0], "'s input: ", std::strerror(errno));
  }
  const int output = options.output_path.empty() ? -1 : create_output_file(options.output_path);
  const int errors = options.stderr_path.empty() ? -1 : create_output_file(options.stderr_path);
  // Everything the child needs is built before fork(): only async-signal-safe calls after it.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    bool replaced = false;
    for (const auto& [key, value] : options.environment) replaced |= entry.rfind(key + "=", 0) == 0;
    if (!replaced) env_text.push_back(entry);
  }
  for (const auto& [key, value] : options.environment) env_text.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) fail("cannot start ", argv[0], ": ", std::strerror(errno));
  if (pid == 0) {
    if (options.timeout_s > 0) setpgid(0, 0);
    dup2(input_file >= 0 ? input_file : input[0], STDIN_FILENO);
    close(input[0]);
    close(input[1]);
    if (output >= 0) {
      dup2(output, STDOUT_FILENO);
      dup2(errors >= 0 ? errors : output, STDERR_FILENO);
    }
    execvpe(args[0], args.data(), envp.data());
    const char message[] = "mmtrain: cannot execute the program: ";
    (void)!write(STDERR_FILENO, message, sizeof(message) - 1);
    (void)!write(STDERR_FILENO, args[0], std::strlen(args[0]));
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  if (options.timeout_s > 0) setpgid(pid, pid);  // also here: the kill must not race the child's own call
  close(input[0]);
  if (input_file >= 0) close(input_file);
  if (output >= 0) close(output);
  if (errors >= 0) close(errors);
  // A child that exits before reading all of stdin must not kill us with SIGPIPE.
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &previous);
  const char* data = options.stdin_text.data();
  size_t left = input_file >= 0 ? 0 : options.stdin_text.size();
  while (left > 0) {
    const ssize_t n = write(input[1], data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child closed its stdin: its exit status tells the rest
    data += n;
    left -= static_cast<size_t>(n);
  }
  close(input[1]);
  sigaction(SIGPIPE, &previous, nullptr);
  return wait_for(pid, argv[0], options.timeout_s);
}

std::string executable_dir() {
  std::error_code error;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) fail("cannot find the running executable (/proc/self/exe): ", error.message());
  return exe.parent_path().string();
}

}  // namespace mmtrain
