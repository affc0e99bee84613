// A subcommand a component contributes to the mmtrain command line without src/tools/ naming it:
// the data fixtures (`mmtrain fixture NAME`) are registered from the dataset folders that know
// their formats, `prepare NAME` and `sample NAME` from the folders that know their model. define() adds the command's options to the CLI11 command it is given and
// returns what runs it once the line is parsed.
#pragma once
#include "core/registry.h"

#include <functional>
#include <string>

namespace CLI {
class App;
}

namespace mmtrain {

struct CliCommand {
  std::string help;
  std::function<std::function<void()>(CLI::App& command)> define;
};

// `mmtrain fixture NAME`: synthetic data sets, so that nothing is ever downloaded.
Registry<CliCommand>& fixture_registry();
// `mmtrain prepare NAME`: raw media encoded into a model's training data (src/media).
Registry<CliCommand>& prepare_registry();
// `mmtrain sample NAME`: what a model makes (src/sample).
Registry<CliCommand>& sample_registry();

// Registers at static initialisation: `static const CliRegistration r(fixture_registry(), "tokens", {...});`.
struct CliRegistration {
  CliRegistration(Registry<CliCommand>& registry, const std::string& name, CliCommand command);
};

}  // namespace mmtrain
