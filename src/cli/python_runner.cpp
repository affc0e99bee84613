#include "cli/python_runner.h"

#include "core/error.h"
#include "core/text.h"
#include "io/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace mmtrain {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPackage = "mmtrain_py";

// `<interpreter> -P` and then args.
std::vector<std::string> python_argv(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {project_python(), "-P"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// `-m mmtrain_py.<module>` and the flags, each flag's value joined to it ("--input=-x"): the
// module's argparse would read a value starting with '-' as a flag of its own.
std::vector<std::string> module_args(const std::string& module, const std::vector<std::string>& args) {
  std::vector<std::string> out = {"-m", std::string(kPackage) + "." + module};
  for (size_t i = 0; i < args.size(); ++i) {
    const bool takes_value = args[i].starts_with("--") && args[i].find('=') == std::string::npos &&
                             i + 1 < args.size() && !args[i + 1].starts_with("--");
    out.push_back(takes_value ? args[i] + "=" + args[i + 1] : args[i]);
    if (takes_value) ++i;
  }
  return out;
}

// The package first, then whatever PYTHONPATH the user has.
std::string package_python_path() {
  const char* existing = std::getenv("PYTHONPATH");
  return existing && *existing ? python_package_dir() + ":" + existing : python_package_dir();
}

std::string cannot_start(const std::string& python) {
  return "cannot run the project's Python '" + python + "' (set $MMTRAIN_PYTHON to a Python with the packages of " +
         "scripts/requirements.txt: scripts/setup.sh installs them in .venv)";
}

}  // namespace

std::string project_python() {
  if (const char* python = std::getenv("MMTRAIN_PYTHON")) return python;
  return MMTRAIN_DEFAULT_PYTHON;
}

std::string python_package_dir() {
  if (const char* path = std::getenv("MMTRAIN_PYTHON_PACKAGE")) return path;
  const auto beside = fs::path(executable_dir()) / ".." / "share" / "mmtrain" / "python";
  if (fs::exists(beside / kPackage)) return fs::weakly_canonical(beside).string();
  fail("cannot find the project's Python package: expected ", beside.string(), "/", kPackage,
       " (the build copies it there) or $MMTRAIN_PYTHON_PACKAGE");
}

std::string argument_number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

void exec_python_module(const std::string& module, const std::vector<std::string>& args) {
  ::setenv("PYTHONPATH", package_python_path().c_str(), 1);
  std::vector<std::string> argv = python_argv(module_args(module, args));
  std::vector<char*> pointers;
  for (auto& arg : argv) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(pointers[0], pointers.data());
  fail(cannot_start(argv[0]), ": ", std::strerror(errno));
}

void run_python_module(const std::string& module, const std::vector<std::string>& args, const std::string& log,
                       const std::string& what) {
  ProcessOptions options;
  options.output_path = log;
  options.environment = {{"PYTHONPATH", package_python_path()}};
  const int status = run_python(module_args(module, args), options);
  const std::string printed = file_read_text(log);
  fs::remove(log);
  if (status != 0) fail(what, " failed (exit status ", status, "): ", trim(printed));
}

void run_python_module_with_input(const std::string& module, const std::string& input, const std::string& what) {
  ProcessOptions options;
  options.stdin_text = input;
  options.environment = {{"PYTHONPATH", package_python_path()}};
  const int status = run_python(module_args(module, {}), options);
  if (status == 127) fail(what, ": ", cannot_start(project_python()));
  if (status != 0) fail(what, " (", std::string(kPackage), ".", module, ") failed with status ", status, " (above)");
}

int run_python(const std::vector<std::string>& args, const ProcessOptions& options) {
  return run_process(python_argv(args), options);
}

}  // namespace mmtrain
