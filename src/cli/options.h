// What several commands' options share: a config's overrides (--set, --set-file), a resolution
// flag, and the rule that an output is always new.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace mmtrain {

// `--set key=value` (repeatable) and `--set-file FILE` of a command that loads a config.
struct ConfigOverrides {
  std::vector<std::string> sets;
  std::string set_file;

  // Adds both options to `command`; `example` is a --set for its help ("training.lr=3e-4").
  void add_options(CLI::App* command, const std::string& example);
  // The set file's lines, then the --set ones, which therefore win.
  std::vector<std::string> resolved() const;
};

// The overrides of a --set-file: one `key=value` per line (what `plan --auto --out` writes); blank
// lines and lines starting with # are skipped; a line without '=' is an error naming the file and
// line.
std::vector<std::string> read_set_file(const std::string& path);

// "HxW" -> {H, W}; both must be positive multiples of `multiple`, else fails naming `flag`.
std::pair<int64_t, int64_t> parse_resolution(const std::string& text, int64_t multiple, const std::string& flag);

// An output must be new (nothing is ever overwritten): fails naming `flag` when anything, a link
// included, is at `path`; `hint` ends the message.
void require_new_path(const std::string& path, const std::string& flag, const std::string& hint = "");

}  // namespace mmtrain
