#include "debugging/fixture.h"

#include "cli/command.h"
#include "config/config.h"
#include "core/cli_command.h"
#include "core/error.h"
#include "core/random.h"
#include "io/safetensors.h"
#include "io/user_file.h"
#include "models/model_spec.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace mmtrain {
namespace {

std::string five_digits(int64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%05lld", static_cast<long long>(i));
  return buf;
}

// One tensor's values: its init rule for a buffer, else N(0, 0.02) drawn in fp32 row blocks of
// <= 16M values (so a 1.6 GB up_gate_proj never exists in fp32 at once).
at::Tensor random_tensor(const Param& param, at::Generator& gen) {
  if (!param.trainable) {
    if (!param.init_value) fail("weights fixture: buffer '", param.local_name, "' has no init rule");
    return param.init_value().to(param.checkpoint_dtype).contiguous();
  }
  auto t = at::empty(param.shape, param.checkpoint_dtype);
  const int64_t rows = param.shape.empty() ? 1 : param.shape[0];
  const int64_t cols = rows == 0 ? 0 : t.numel() / rows;
  auto flat = t.view({rows, cols});
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(cols, 1));
  for (int64_t r = 0; r < rows; r += block) {
    const int64_t m = std::min(block, rows - r);
    flat.narrow(0, r, m).copy_(at::randn({m, cols}, gen, at::kFloat) * 0.02);
  }
  return t;
}

}  // namespace

void write_weights_fixture(Model& model, const HfAdapter& adapter, const std::string& out_dir, int64_t shards,
                           uint64_t seed) {
  const auto params = model.named_parameters();
  const int64_t n = static_cast<int64_t>(params.size());
  const int64_t k = shards > 0 ? shards : std::min<int64_t>(7, n);
  if (shards < 0 || k > n)
    fail("fixture weights: --shards must be in 1..", n, " (one tensor per shard at least), found ", shards);

  std::vector<int64_t> bytes(n);
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& p = *params[i].second;
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    bytes[i] = numel * static_cast<int64_t>(c10::elementSize(p.checkpoint_dtype));
    total += bytes[i];
  }
  // Shard of tensor i: the cumulative-bytes midpoint scaled to K, kept monotonic, never skipping
  // a shard and leaving enough tensors for the shards after it, so all K shards are non-empty.
  std::vector<int64_t> shard_of(n);
  int64_t before = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double mid = static_cast<double>(before) + bytes[i] / 2.0;
    int64_t s = static_cast<int64_t>(mid * k / std::max<double>(static_cast<double>(total), 1.0));
    const int64_t prev = i == 0 ? 0 : shard_of[i - 1];
    s = std::clamp<int64_t>(s, prev, std::min(prev + 1, k - 1));
    if (i == 0) s = 0;
    s = std::max(s, k - (n - i));  // tensors i..n-1 must still cover shards s..k-1
    shard_of[i] = s;
    before += bytes[i];
  }

  std::filesystem::create_directories(out_dir);
  std::vector<std::pair<std::string, std::string>> weight_map;
  int64_t i = 0;
  for (int64_t shard = 0; shard < k; ++shard) {
    const std::string file = "model-" + five_digits(shard + 1) + "-of-" + five_digits(k) + ".safetensors";
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (; i < n && shard_of[i] == shard; ++i) {
      const auto& [name, param] = params[i];
      auto gen = indexed_generator(seed, static_cast<uint64_t>(i));
      const auto key = adapter.hf_key(name);
      tensors.emplace_back(key, random_tensor(*param, gen).contiguous());
      weight_map.emplace_back(key, file);
    }
    safetensors_write((std::filesystem::path(out_dir) / file).string(), tensors, {{"format", "pt"}});
  }
  std::sort(weight_map.begin(), weight_map.end());  // as HF save_pretrained writes its index
  nlohmann::ordered_json metadata = {{"total_size", total}};
  safetensors_index_write((std::filesystem::path(out_dir) / "model.safetensors.index.json").string(), metadata,
                          weight_map);
}

void add_fixture_commands(CLI::App& app, Commands& commands) {
  auto* fixture = app.add_subcommand("fixture", "generate synthetic data / weights");
  fixture->require_subcommand(1);
  for (const auto& name : fixture_registry().names()) {
    const auto& entry = fixture_registry().get(name);
    auto* cmd = fixture->add_subcommand(name, entry.help);
    commands.add(cmd, entry.define(*cmd));
  }
  for (const auto& name : model_spec_registry().names()) {
    struct Options {
      std::string config_path, out_dir;
      int64_t shards = 0;
      uint64_t seed = 0;
    };
    auto o = std::make_shared<Options>();
    const auto& spec = model_spec(name);
    auto* cmd = fixture->add_subcommand(
        name + "-weights", "random weights of the " + spec.title + " in its public HF layout (safetensors shards + index)");
    cmd->add_option("--config", o->config_path, "YAML config whose model.config sets the dimensions")->required();
    cmd->add_option("--out", o->out_dir, "output directory")->required();
    cmd->add_option("--shards", o->shards, "number of shards (default min(7, tensors))");
    cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
    commands.add(cmd, [o, name] {
      const auto config = config_load(o->config_path);
      if (config.model.model_id != name)
        fail("fixture ", name, "-weights: config ", o->config_path, ": model.model_id must be ", name, ", found '",
             config.model.model_id, "'");
      const auto& spec = model_spec(name);
      const auto model = spec.build(config.model.config);
      write_weights_fixture(*model, *make_hf_adapter(spec, config.model.config), o->out_dir, o->shards, o->seed);
      if (spec.hf_config) {  // the tiny model's own config.json, for HF tools
        const std::string path = (std::filesystem::path(o->out_dir) / "config.json").string();
        write_file_no_follow(path, spec.hf_config(config.model.config).dump(2) + "\n", path);
      }
      std::printf("wrote %s\n", o->out_dir.c_str());
    });
  }
}

}  // namespace mmtrain
