#include "cli/options.h"

#include "core/error.h"
#include "io/user_file.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace mmtrain {

namespace fs = std::filesystem;

void ConfigOverrides::add_options(CLI::App* command, const std::string& example) {
  command->add_option("--set", sets, "override a config key: --set " + example + " (repeatable)");
  command->add_option("--set-file,--set_file", set_file,
                      "overrides from a file, one key=value per line (plan --auto --out writes one); --set wins");
}

std::vector<std::string> ConfigOverrides::resolved() const {
  auto out = set_file.empty() ? std::vector<std::string>{} : read_set_file(set_file);
  out.insert(out.end(), sets.begin(), sets.end());
  return out;
}

std::vector<std::string> read_set_file(const std::string& path) {
  std::istringstream in(read_user_file(path, "--set-file " + path, kMaxConfigFileBytes));
  std::vector<std::string> sets;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto begin = line.find_first_not_of(" \t\r"), end = line.find_last_not_of(" \t\r");
    if (begin == std::string::npos || line[begin] == '#') continue;
    line = line.substr(begin, end - begin + 1);
    if (line.find('=') == std::string::npos)
      fail("--set-file ", path, " line ", number, ": expected key=value, found '", line, "'");
    sets.push_back(line);
  }
  return sets;
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

void require_new_path(const std::string& path, const std::string& flag, const std::string& hint) {
  std::error_code error;
  if (fs::symlink_status(path, error).type() != fs::file_type::not_found)
    fail(flag, " ", path, " exists; give a new directory", hint);
}

}  // namespace mmtrain
