#include "core/cli_command.h"

namespace mmtrain {

Registry<CliCommand>& fixture_registry() {
  static Registry<CliCommand> registry("fixture");
  return registry;
}

Registry<CliCommand>& prepare_registry() {
  static Registry<CliCommand> registry("prepare");
  return registry;
}

Registry<CliCommand>& sample_registry() {
  static Registry<CliCommand> registry("sample");
  return registry;
}

CliRegistration::CliRegistration(Registry<CliCommand>& registry, const std::string& name, CliCommand command) {
  registry.add(name, std::move(command));
}

}  // namespace mmtrain
