#include "convert/base_files.h"

#include "core/error.h"
#include "core/text.h"
#include "io/user_file.h"

#include <cstdio>
#include <filesystem>
#include <set>

namespace mmtrain {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxBaseFileBytes = int64_t{1} << 30;  // tokenizers and processors are megabytes

bool is_weight_file(const std::string& name, bool with_weight_index) {
  static const std::set<std::string> kWeightExtensions = {".safetensors", ".bin", ".pth", ".pt", ".ckpt",
                                                          ".msgpack", ".h5", ".gguf", ".npz", ".onnx"};
  if (name.ends_with(".index.json")) return !(with_weight_index && name == "model.safetensors.index.json");
  return kWeightExtensions.count(fs::path(name).extension().string()) > 0;
}

}  // namespace

void copy_base_files(const std::string& base_dir, const std::string& to, const std::string& command,
                     const BaseFileOptions& options) {
  const fs::path base = fs::canonical(base_dir);
  const fs::path tree = base.parent_path().filename() == "snapshots" ? base.parent_path().parent_path() : base;
  const auto inside = [&](const fs::path& p) {
    const auto rel = p.lexically_relative(tree);
    return !rel.empty() && *rel.begin() != "..";
  };
  for (const auto& entry : fs::directory_iterator(base)) {
    const auto name = entry.path().filename().string();
    if (name.starts_with('.') || is_weight_file(name, options.with_weight_index)) continue;
    std::error_code error;
    const fs::path target = fs::weakly_canonical(entry.path(), error);
    if (error || !inside(target)) {
      if (entry.is_symlink(error))
        std::printf("%s: not copied: %s links outside the base's tree %s\n", command.c_str(), printable(name).c_str(),
                    printable(tree.string()).c_str());
      continue;
    }
    if (!fs::is_regular_file(fs::symlink_status(target, error))) continue;  // directories, FIFOs, devices: never read
    std::string content = read_user_file(target.string(), command + ": " + target.string(), kMaxBaseFileBytes);
    if (name == "config.json" && options.edit_config) content = options.edit_config(content);
    write_file_no_follow((fs::path(to) / name).string(), content, name);
  }
}

}  // namespace mmtrain
