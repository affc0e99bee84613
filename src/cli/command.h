// How a tool puts its subcommands on the mmtrain command line: each tools/<tool>.cpp declares its
// options on the CLI11 app main() hands it, next to the code that uses them, and registers what
// runs once that subcommand is parsed. main() only calls the add_*_commands functions below.
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

// The overrides of a --set-file: one `key=value` per line (what `plan --auto --out` writes); blank
// lines and lines starting with # are skipped; a line without '=' is an error naming the file and
// line. They come before the command line's own --set, which therefore win.
std::vector<std::string> read_set_file(const std::string& path);

// `mmtrain NAME SUB ...` for each SUB a component registered in `registry` (core/cli_command.h):
// `prepare` and `sample` come from the folders that know their model (src/media, src/sample).
void add_registered_commands(CLI::App& app, Commands& commands, const std::string& name, const std::string& help,
                             Registry<CliCommand>& registry);

void add_train_commands(CLI::App& app, Commands& commands);    // train (tools/train.cpp)
void add_eval_commands(CLI::App& app, Commands& commands);     // eval CONFIG --load DIR
void add_fixture_commands(CLI::App& app, Commands& commands);  // fixture NAME, fixture MODEL-weights
void add_convert_commands(CLI::App& app, Commands& commands);  // convert MODEL hf-to-ckpt | ckpt-to-hf
void add_flops_commands(CLI::App& app, Commands& commands);    // flops MODEL
void add_plan_commands(CLI::App& app, Commands& commands);     // plan CONFIG
void add_logs_commands(CLI::App& app, Commands& commands);     // logs parse | summary | compare
void add_debug_commands(CLI::App& app, Commands& commands);    // debug collate | step | tokenize | image
void add_measure_commands(CLI::App& app, Commands& commands);  // measure gemm
void add_ablate_commands(CLI::App& app, Commands& commands);   // ablate CONFIG --feature ...
void add_ckpt_commands(CLI::App& app, Commands& commands);     // ckpt verify DIR

}  // namespace mmtrain
