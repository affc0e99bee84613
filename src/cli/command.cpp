#include "tools/command.h"

#include "core/error.h"
#include "io/user_file.h"

#include <CLI/CLI.hpp>

#include <sstream>

namespace mmtrain {

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

bool Commands::run_parsed() const {
  for (const auto& [command, run] : commands_)
    if (command->parsed()) {
      run();
      return true;
    }
  return false;
}

void add_registered_commands(CLI::App& app, Commands& commands, const std::string& name, const std::string& help,
                             Registry<CliCommand>& registry) {
  auto* parent = app.add_subcommand(name, help);
  parent->require_subcommand(1);
  for (const auto& sub : registry.names()) {
    const auto& entry = registry.get(sub);
    auto* cmd = parent->add_subcommand(sub, entry.help);
    commands.add(cmd, entry.define(*cmd));
  }
}

}  // namespace mmtrain
