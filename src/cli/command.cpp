#include "cli/command.h"

#include <CLI/CLI.hpp>

namespace mmtrain {

bool Commands::run_parsed() const {
  for (const auto& [command, run] : commands_)
    if (command->parsed()) {
      run();
      return true;
    }
  return false;
}

CLI::App* subcommand_of(CLI::App& parent, const std::string& name, const std::string& help) {
  const auto named = parent.get_subcommands([&](CLI::App* sub) { return sub->get_name() == name; });
  if (!named.empty()) return named.front();
  auto* made = parent.add_subcommand(name, help);
  made->require_subcommand(1);
  return made;
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
