// mmtrain: the command-line entry point. Each room adds its own commands (cli/command.h);
// `mmtrain --help` and `mmtrain SUBCOMMAND --help` list them:
//   train     CONFIG [--set key=value ...]         train (under torchrun for several ranks)      runs/
//   eval      CONFIG --load DIR                    the held-out loss of weights                  runs/
//   convert   MODEL hf-to-ckpt | ckpt-to-hf | ...  HF, DCP and peft layouts, quantized bases     convert/, adapters/
//   ckpt      verify DIR                           check a checkpoint's files and checksums      convert/
//   logs      parse | summary | compare | plot     training logs (metrics.jsonl or Megatron)     analysis/
//   ablate    CONFIG --feature NAME:KEY=VALUE ...  the seeds' feature-ablation table             analysis/
//   plan      CONFIG --world-size N                per-rank memory and step time                 planning/
//   measure   gemm | profile | cp-attention        what this machine reaches                     planning/
//   flops     MODEL --config CFG | --ckpt DIR ...  model FLOPs, TFLOP/s, MFU (docs/flops.md)     planning/
//   debug     collate | step | tokenize | image    one stage of the pipeline alone               debugging/
//   fixture   NAME ... | MODEL-weights ...         synthetic data sets and HF-layout weights     debugging/
//   prepare   MODEL ...                            raw media into training data                  media/
//   sample    MODEL ...                            generate with a model                         sample/
// Models, datasets and fixtures register themselves from their own folders, so this file and the
// command rooms name none of them.
#include "cli/command.h"
#include "core/error.h"
#include "core/fatal_signal.h"
#include "core/suggest.h"
#include "core/text.h"
#include "dist/failure_report.h"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <csignal>
#include <cstdio>

namespace {

// CLI11 answers a misspelled subcommand with "A subcommand is required". Where a command has
// subcommands, the first word that is not an option must name one of them: say which word is
// unknown, the closest name and the known ones. Returns false after printing that error.
bool subcommands_exist(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  std::string path = "mmtrain";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return true;
    if (word.empty() || word[0] == '-') continue;
    const auto subcommands = level->get_subcommands([](CLI::App*) { return true; });
    if (subcommands.empty()) return true;  // the rest are this command's own arguments
    std::vector<std::string> names;
    CLI::App* found = nullptr;
    for (auto* sub : subcommands) {
      names.push_back(sub->get_name());
      if (sub->check_name(word)) found = sub;
    }
    if (!found) {
      const auto suggestion = mmtrain::closest_name(word, names);
      std::fprintf(stderr, "mmtrain: error: '%s' is not a command of %s%s; known: %s\n", word.c_str(), path.c_str(),
                   suggestion.empty() ? "" : (" (did you mean '" + suggestion + "'?)").c_str(),
                   mmtrain::join_names(names).c_str());
      return false;
    }
    level = found;
    path += " " + found->get_name();
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mmtrain;
  install_fatal_signal_handlers();
  // A write to a peer's closed socket (a rank that died) must fail with EPIPE, which the
  // collectives and the peer watch turn into an error naming that rank, not kill this process
  // silently with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"mmtrain: FSDP2 training for large multimodal models"};
  app.require_subcommand(1);
  Commands commands;
  add_train_commands(app, commands);
  add_eval_commands(app, commands);
  add_convert_commands(app, commands);
  add_adapter_commands(app, commands);
  add_ckpt_commands(app, commands);
  add_logs_commands(app, commands);
  add_ablate_commands(app, commands);
  add_plan_commands(app, commands);
  add_measure_commands(app, commands);
  add_flops_commands(app, commands);
  add_debug_commands(app, commands);
  add_fixture_commands(app, commands);
  add_registered_commands(app, commands, "prepare", "encode raw media into a model's training data", prepare_registry());
  add_registered_commands(app, commands, "sample", "generate with a model (launch with torchrun for N ranks)", sample_registry());

  if (!subcommands_exist(app, argc, argv)) return 2;
  CLI11_PARSE(app, argc, argv);
  try {
    commands.run_parsed();
  } catch (const Error& e) {
    std::fprintf(stderr, "mmtrain: error: %s\n", printable(e.what()).c_str());
    report_failure_to_launcher(e.what());
    return 1;
  } catch (const c10::Error& e) {
    // From LibTorch or c10d (e.g. a peer rank died): the message without LibTorch's C++ frames.
    const std::string message = e.what_without_backtrace();
    std::fprintf(stderr, "mmtrain: error: %s\n", printable(with_peer_failure_hint(message)).c_str());
    report_failure_to_launcher(message);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mmtrain: internal error: %s\n", printable(e.what()).c_str());
    report_failure_to_launcher(std::string("internal error: ") + e.what());
    return 2;
  }
  return 0;
}
