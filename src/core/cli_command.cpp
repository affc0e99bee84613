#include "core/cli_command.h"

namespace mmtrain {

Registry<CliCommand>& fixture_registry() {
  static Registry<CliCommand> registry("fixture");
  return registry;
}

FixtureRegistration::FixtureRegistration(const std::string& name, CliCommand command) {
  fixture_registry().add(name, std::move(command));
}

}  // namespace mmtrain
