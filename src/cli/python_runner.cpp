#include "media/media_room.h"

#include "core/error.h"
#include "core/subprocess.h"
#include "tools/plots.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace mmtrain {

namespace fs = std::filesystem;

std::string argument_number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

void require_new_path(const std::string& path, const std::string& flag, const std::string& hint) {
  std::error_code error;
  if (fs::symlink_status(path, error).type() != fs::file_type::not_found)
    fail(flag, " ", path, " exists; give a new directory", hint);
}

std::string media_path() {
  if (const char* path = std::getenv("MMTRAIN_MEDIA_PATH")) return path;
  const auto beside = fs::path(executable_dir()) / ".." / "share" / "mmtrain" / "python";
  if (fs::exists(beside / "mmtrain_media")) return fs::weakly_canonical(beside).string();
  fail("cannot find the media room: expected ", beside.string(), "/mmtrain_media (the build copies it there) or "
       "$MMTRAIN_MEDIA_PATH");
}

std::pair<int64_t, int64_t> parse_resolution(const std::string& text, int64_t multiple, const std::string& flag) {
  const auto x = text.find('x');
  char* end = nullptr;
  errno = 0;
  const long long height = x == std::string::npos ? 0 : std::strtoll(text.c_str(), &end, 10);
  const bool height_ok = x != std::string::npos && end == text.c_str() + x;
  const long long width = height_ok ? std::strtoll(text.c_str() + x + 1, &end, 10) : 0;
  if (!height_ok || *end != '\0' || errno != 0 || height <= 0 || width <= 0 || height > 16384 || width > 16384)
    fail(flag, " '", text, "': expected HxW, two positive integers up to 16384 (e.g. 256x480)");
  if (height % multiple != 0 || width % multiple != 0)
    fail(flag, " ", text, ": both sides must be multiples of ", multiple,
         multiple == 32 ? " (the VAE's 16x16 stride times the 2x2 patch)" : "");
  return {height, width};
}

namespace {

// The room first, then whatever PYTHONPATH the user has.
std::string media_python_path() {
  const char* existing = std::getenv("PYTHONPATH");
  return existing && *existing ? media_path() + ":" + existing : media_path();
}

// `-m mmtrain_media.<module>` and the flags, each flag's value joined to it ("--input=-x"): the
// room's argparse would read a value starting with '-' as a flag of its own.
std::vector<std::string> module_argv(const std::string& module, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"-m", "mmtrain_media." + module};
  for (size_t i = 0; i < args.size(); ++i) {
    const bool takes_value = args[i].starts_with("--") && args[i].find('=') == std::string::npos &&
                             i + 1 < args.size() && !args[i + 1].starts_with("--");
    argv.push_back(takes_value ? args[i] + "=" + args[i + 1] : args[i]);
    if (takes_value) ++i;
  }
  return argv;
}

}  // namespace

void exec_media_module(const std::string& module, const std::vector<std::string>& args) {
  ::setenv("PYTHONPATH", media_python_path().c_str(), 1);
  const std::string python = tools_python();
  std::vector<std::string> argv = {python};
  for (auto& arg : python_isolation_flags()) argv.push_back(arg);
  for (auto& arg : module_argv(module, args)) argv.push_back(arg);
  std::vector<char*> pointers;
  for (auto& arg : argv) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(pointers[0], pointers.data());
  fail("cannot run the media room's Python '", python, "': ", std::strerror(errno),
       " (set $MMTRAIN_PYTHON to a Python with diffusers, transformers and av: scripts/setup.sh installs them in .venv)");
}

void run_media_module(const std::string& module, const std::vector<std::string>& args, const std::string& log,
                      const std::string& what) {
  run_tools_python(module_argv(module, args), log, what, {{"PYTHONPATH", media_python_path()}});
}

}  // namespace mmtrain
