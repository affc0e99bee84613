#include "tools/command.h"

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

}  // namespace mmtrain
