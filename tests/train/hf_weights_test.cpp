// WeightSource: what the trainer reads HF weights through. Non-finite values are an error naming
// the tensor and the file that holds it (single file and sharded index alike); a path that is not
// a file or directory says what it is instead of "missing".
#include "train/hf_weights.h"

#include "checkpoint/checkpoint_test_util.h"
#include "io/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <limits>

namespace mmtrain {
namespace {

TEST(WeightSource, NonFiniteWeightsNameTensorAndFile) {
  testing::TempDir dir;
  auto bad = at::ones({3, 2});
  bad[2][1] = std::numeric_limits<float>::infinity();
  safetensors_write(dir / "model.safetensors", {{"good", at::ones({2})}, {"bad", bad}}, {});
  WeightSource single(dir / "model.safetensors");
  EXPECT_TRUE(at::equal(single.read_rows("good", 0, 2), at::ones({2})));
  EXPECT_TRUE(at::equal(single.read_rows("bad", 0, 2), at::ones({2, 2})));  // the bad row not read
  EXPECT_CONTAINS(testing::error_of([&] { single.read_rows("bad", 1, 3); }),
                  "model weights " + (dir / "model.safetensors") + ": tensor 'bad' holds inf (element 3 of rows [1, 3))");

  // A sharded HF directory names the shard file.
  const std::string sharded = dir / "sharded";
  std::filesystem::create_directories(sharded);
  safetensors_write(sharded + "/model-00001-of-00002.safetensors", {{"good", at::ones({2})}}, {});
  safetensors_write(sharded + "/model-00002-of-00002.safetensors", {{"bad", bad}}, {});
  std::ofstream(sharded + "/model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"good": "model-00001-of-00002.safetensors", "bad": "model-00002-of-00002.safetensors"}})";
  WeightSource index(sharded);
  EXPECT_CONTAINS(testing::error_of([&] { index.read_rows("bad", 0, 3); }),
                  "model weights " + sharded + "/model-00002-of-00002.safetensors: tensor 'bad' holds inf");
}

TEST(WeightSource, PathsThatAreNotWeightsSayWhatTheyAre) {
  EXPECT_CONTAINS(testing::error_of([] { WeightSource("/dev/zero"); }),
                  "model weights '/dev/zero': not a regular file (a FIFO, device or socket)");
  EXPECT_CONTAINS(testing::error_of([] { WeightSource("/nonexistent/weights"); }), "no such file");
}

}  // namespace
}  // namespace mmtrain
