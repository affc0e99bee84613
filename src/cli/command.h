// How a room puts its commands on the mmtrain command line: each command's file declares its
// options on the CLI11 app main() hands it, next to the code that uses them, and registers what
// runs once that subcommand is parsed. main() only calls the add_*_commands functions below, one
// per room (each room's README says what it owns).
#pragma once
#include "core/cli_command.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace mmtrain {

class Commands {
 public:
  void add(CLI::App* command, std::function<void()> run) { commands_.emplace_back(command, std::move(run)); }
  // Runs the action of the subcommand the line named; false when it named none of these.
  bool run_parsed() const;

 private:
  std::vector<std::pair<CLI::App*, std::function<void()>>> commands_;
};

// parent's subcommand `name`, made (requiring a subcommand of its own) by the first room that asks:
// two rooms add verbs to one `convert MODEL` this way.
CLI::App* subcommand_of(CLI::App& parent, const std::string& name, const std::string& help);

// `mmtrain NAME SUB ...` for each SUB a component registered in `registry` (core/cli_command.h):
// `prepare` and `sample` come from the folders that know their model (src/media, src/sample).
void add_registered_commands(CLI::App& app, Commands& commands, const std::string& name, const std::string& help,
                             Registry<CliCommand>& registry);

void add_train_commands(CLI::App& app, Commands& commands);     // runs/: train CONFIG
void add_eval_commands(CLI::App& app, Commands& commands);      // runs/: eval CONFIG --load DIR
void add_convert_commands(CLI::App& app, Commands& commands);   // convert/: convert MODEL hf-to-ckpt | ckpt-to-hf | dcp
void add_adapter_commands(CLI::App& app, Commands& commands);   // adapters/: convert MODEL lora-to-peft | merge-lora | ...
void add_ckpt_commands(CLI::App& app, Commands& commands);      // convert/: ckpt verify DIR
void add_logs_commands(CLI::App& app, Commands& commands);      // analysis/: logs parse | summary | compare | plot
void add_ablate_commands(CLI::App& app, Commands& commands);    // analysis/: ablate CONFIG --feature ...
void add_plan_commands(CLI::App& app, Commands& commands);      // planning/: plan CONFIG
void add_measure_commands(CLI::App& app, Commands& commands);   // planning/: measure gemm | profile | cp-attention
void add_flops_commands(CLI::App& app, Commands& commands);     // planning/: flops MODEL
void add_debug_commands(CLI::App& app, Commands& commands);     // debugging/: debug collate | step | tokenize | image
void add_fixture_commands(CLI::App& app, Commands& commands);   // debugging/: fixture NAME, fixture MODEL-weights

}  // namespace mmtrain
