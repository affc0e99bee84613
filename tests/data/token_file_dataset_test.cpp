// The token_file dataset's parameters: unknown keys are refused with did-you-mean, a negative
// max_samples is refused, before any file is opened.
#include "data/dataset.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace mmtrain {
namespace {

std::string token_file_error(const nlohmann::json& params) {
  DataConfig data;
  data.dataset_param = params;
  return testing::error_of([&] { dataset_registry().get("token_file", "test")(data, ModelConfig{}); });
}

TEST(TokenFileDataset, RefusesUnknownAndNegativeParameters) {
  EXPECT_CONTAINS(token_file_error({{"dataset_type", "token_file"}, {"path", "t.safetensors"}, {"max_sample", 3}}),
                  "data.dataset_param.max_sample");
  EXPECT_CONTAINS(token_file_error({{"dataset_type", "token_file"}, {"path", "t.safetensors"}, {"max_sample", 3}}),
                  "max_samples");  // the did-you-mean
  EXPECT_CONTAINS(token_file_error({{"dataset_type", "token_file"}, {"path", "t.safetensors"}, {"max_samples", -2}}),
                  "data.dataset_param.max_samples: expected >= 0 (0 = all), found -2");
  EXPECT_CONTAINS(token_file_error({{"dataset_type", "token_file"}}), "data.dataset_param.path: required");
}

}  // namespace
}  // namespace mmtrain
