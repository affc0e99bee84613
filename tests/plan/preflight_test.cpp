// Pre-flight: what a run checks before it builds anything model-sized.
#include "io/atomic_file.h"
#include "test_util.h"
#include "config/config.h"
#include "plan/preflight.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("mmtrain_preflight_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// A config with these training keys whose logging.output_dir is under the scratch dir `dir`.
Config config_with(const std::string& training, const std::string& dir) {
  return config_from_yaml_string(
      "model:\n  model_id: test_transformer\ntraining:\n" + training + "logging:\n  output_dir: " + dir + "/out\n",
      "p.yaml", {});
}

TEST(Preflight, PathsAreCheckedBeforeTheRun) {
  const auto dir = scratch("paths");
  std::ofstream(dir + "/a_file") << "x";
  EXPECT_CONTAINS(testing::error_of([&] { preflight_paths(config_with("  save: " + dir + "/a_file/ckpt\n", dir), 0); }),
                  "training.save '" + dir + "/a_file/ckpt' cannot be created");
  EXPECT_CONTAINS(testing::error_of([&] { preflight_paths(config_with("  load: " + dir + "/nowhere\n", dir), 0); }),
                  "training.load '" + dir + "/nowhere' does not exist");
  EXPECT_NO_THROW(preflight_paths(config_with("  save: " + dir + "/ckpt\n", dir), 3));
  EXPECT_TRUE(fs::is_directory(dir + "/ckpt"));
  EXPECT_TRUE(fs::is_empty(dir + "/ckpt"));  // the probe file is gone again
  // A path that is not UTF-8 cannot be recorded in a checkpoint's JSON: refused now, not at the first save.
  EXPECT_CONTAINS(testing::error_of([&] { preflight_paths(config_with("  save: " + dir + "/\xff\n", dir), 0); }),
                  "not valid UTF-8");
  fs::remove_all(dir);
}

TEST(Preflight, OutputDirAndLoadingFromTheOwnSaveRoot) {
  const auto dir = scratch("output");
  std::ofstream(dir + "/a_file") << "x";
  const auto under_a_file = config_from_yaml_string(
      "model:\n  model_id: test_transformer\nlogging:\n  output_dir: " + dir + "/a_file/out\n", "p.yaml", {});
  EXPECT_CONTAINS(testing::error_of([&] { preflight_paths(under_a_file, 0); }),
                  "logging.output_dir '" + dir + "/a_file/out' cannot be created");
  const auto in_proc = config_from_yaml_string("model:\n  model_id: test_transformer\nlogging:\n  output_dir: /proc/mmtrain_out\n",
                                               "p.yaml", {});
  EXPECT_CONTAINS(testing::error_of([&] { preflight_paths(in_proc, 0); }), "logging.output_dir '/proc/mmtrain_out' cannot be created");

  // training.load naming this run's own save root before it holds a checkpoint: say what auto does.
  const auto own_root = config_with("  save: " + dir + "/ckpt\n  load: " + dir + "/ckpt\n", dir);
  EXPECT_CONTAINS(testing::error_of([&] { preflight_paths(own_root, 0); }),
                  "training.load '" + dir + "/ckpt' is this run's training.save, which holds no checkpoint yet; use "
                  "training.load: auto, which resumes when a checkpoint is there and starts fresh when none is");
  fs::remove_all(dir);
}

TEST(Preflight, AvailableMemoryIsReadable) {
  const auto available = available_memory_bytes();
  ASSERT_TRUE(available.has_value());  // Linux: MemAvailable
  EXPECT_GT(*available, int64_t{1} << 20);
}

TEST(Preflight, FilesThatAreNotRegularAreNamed) {
  const auto dir = scratch("irregular");
  EXPECT_CONTAINS(testing::error_of([&] { file_read_text(dir); }), "not a regular file (a directory)");
  EXPECT_CONTAINS(testing::error_of([&] { file_read_text("/dev/zero"); }), "a FIFO, device or socket");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mmtrain
