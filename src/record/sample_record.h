// What a sampling phase of training reports (train/training_sampler.h): where its samples are, how
// long it took, and what TensorBoard shows of them (a video model: a grid of frames and the audio
// of each decoded sample; a language model: each completion as text). metrics.jsonl gets one line,
// {"kind": "samples", "iteration", "dir", "samples_s"} and, on a GPU, "peak_device_allocated_mb":
// the phase's own peak (the allocator's, reset when it begins; the largest over ranks), which the
// step records beside it show against their own. A phase that failed has "error" (its message)
// and no dir.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

inline constexpr const char* kSampleRecordKind = "samples";

struct SampleRecord {
  struct Image {
    std::string tag;
    std::string png;  // the encoded image
    int64_t height = 0, width = 0;
  };
  struct Audio {
    std::string tag;
    std::string wav;  // 16-bit PCM
    double sample_rate = 0;
    int64_t channels = 0, frames = 0;
  };
  struct Text {
    std::string tag, text;
  };
  int64_t iteration = 0;
  std::string dir;
  std::string heading = "samples after";  // the console line's: GRPO's rollout texts say "rollout for"
  double seconds = 0;
  std::optional<double> peak_device_allocated_mb;
  std::string error;  // empty: the samples are in dir
  std::vector<Image> images;
  std::vector<Audio> audio;
  std::vector<Text> texts;

  nlohmann::json to_json() const;
};

}  // namespace mmtrain
