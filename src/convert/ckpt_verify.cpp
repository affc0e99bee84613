// `mmtrain ckpt verify DIR`: checks a checkpoint without training: index.json against every rank
// file, and every shard's bytes against its CRC-32C (checkpoint/sharded_checkpoint.h).
#include "checkpoint/sharded_checkpoint.h"
#include "cli/command.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

namespace mmtrain {

void add_ckpt_commands(CLI::App& app, Commands& commands) {
  auto* ckpt = app.add_subcommand("ckpt", "mmtrain checkpoints");
  ckpt->require_subcommand(1);
  auto path = std::make_shared<std::string>();
  auto* verify = ckpt->add_subcommand("verify", "read every shard of a checkpoint and check its checksum");
  verify->add_option("dir", *path, "a save root (its `latest`) or an iter_N directory")->required();
  commands.add(verify, [path] {
    const auto start = std::chrono::steady_clock::now();
    const CheckpointReader reader(*path);
    const auto report = reader.verify();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: iteration %lld, %d rank files, %zu tensors: %lld shards match their checksums (%.1f MiB in %.2f s)",
                reader.dir().c_str(), static_cast<long long>(reader.iteration()), reader.saved_world_size(),
                reader.names().size(), static_cast<long long>(report.shards_checked), report.bytes / 1048576.0, seconds);
    if (report.shards_without_checksum > 0)
      std::printf("; %lld shards have no checksum (saved before checksums existed) and were only read",
                  static_cast<long long>(report.shards_without_checksum));
    std::printf("\n%s\n", nlohmann::json{{"dir", reader.dir()},
                                         {"iteration", reader.iteration()},
                                         {"shards_checked", report.shards_checked},
                                         {"shards_without_checksum", report.shards_without_checksum},
                                         {"bytes", report.bytes},
                                         {"ok", true}}
                              .dump()
                              .c_str());
  });
}

}  // namespace mmtrain
