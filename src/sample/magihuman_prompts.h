// MagiHuman's prompts file and the sampling of a set of prompts over the ranks, shared by
// `mmtrain sample magihuman` and the training's samples (training.sample_prompts).
//
// One JSON object a line: {"prompt": TEXT} (embedded by the media room's T5Gemma) or
// {"conditions": FILE} (a precomputed embedding, relative to the prompts file and inside its
// folder), with optional "seed", "negative_conditions" (a file, as conditions) and the settings
// "seconds", "resolution" ("HxW"), "steps", "shift", "guidance_video", "guidance_audio", which
// replace the defaults for that line only.
#pragma once
#include "sample/magihuman_sampler.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {
struct Run;
}

namespace mmtrain::sample {

// A prompt's text rows at most: upstream's t5_gemma_target_length, to which text is padded or trimmed.
constexpr int64_t kMaxTextTokens = 640;

struct MagiHumanSampleSettings {
  double seconds = 5.0;
  int64_t height = 256, width = 480;
  MagiHumanSampling sampling;
};

struct MagiHumanPrompt {
  std::string text;                 // to embed, or
  std::string conditions;           // a precomputed embedding file
  std::string negative_conditions;  // this line's negative embedding file ("": the run's)
  uint64_t seed = 0;
  MagiHumanSampleSettings settings;
  bool sized = false;                 // the line gave its own seconds and resolution
  at::Tensor embedding;                // [Nt, Ct] fp32, once read or embedded
  std::optional<at::Tensor> negative;  // [Nn, Ct]; none: no guidance (cfg_number 1)
};

// The lines of `path`, each checked (keys, types, ranges, paths); a line without a seed takes
// default_seed + its index. Fails naming the file and line.
std::vector<MagiHumanPrompt> read_magihuman_prompts(const std::string& path, uint64_t default_seed,
                                                    const MagiHumanSampleSettings& defaults);

// A text embedding [Nt <= 640, text_channels] from a safetensors file ("prompt_embeds" or
// "text_embed"), checked: shape, dtype, finite. Fails naming the file.
at::Tensor read_text_embedding(const std::string& path, int64_t text_channels);

// Reads each prompt's embedding files: its `conditions` (a text prompt keeps the embedding the caller
// set) and its negative, from its line's `negative_conditions`, else `negative` (none: no guidance).
void read_magihuman_embeddings(std::vector<MagiHumanPrompt>& prompts, int64_t text_channels,
                               const std::optional<at::Tensor>& negative);

// Samples every prompt (embeddings set), prompt i on data-parallel rank i % dp, into
// out_dir/<i>.safetensors (video_latent tokens, video_grid_thw, audio_latent) and <i>.json (the
// settings). A rank with fewer prompts samples prompt 0 again and drops it (FSDP's gathers need
// every rank in every forward). `load` is recorded in the JSON. Collective.
void sample_magihuman_prompts(Run& run, const std::vector<MagiHumanPrompt>& prompts, const std::string& out_dir,
                              const std::string& load);

}  // namespace mmtrain::sample
