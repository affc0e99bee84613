// `mmtrain fixture ...`: generates the data and weights tests, benchmarks and the demo use, so
// nothing is ever downloaded.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace mmtrain {

// tokens.safetensors with `tokens` int64 [samples, seq_len] in [0, vocab): uniform, or (learnable)
// a noisy affine recurrence a model can fit.
void fixture_tokens(const std::string& out_path, int64_t samples, int64_t seq_len, int64_t vocab, uint64_t seed,
                    bool learnable);

// MagiHuman precomputed samples in the `magihuman_precomputed` layout: out_dir/{latents,
// audio_latents, conditions}/sample_NNNNNN.{pt,safetensors}. Defaults are the official 5 s 256p
// shape (seed 000 §7): video [3840, 192] grid (32, 8, 15), audio [126, 64], text [640, 3584],
// 4606 packed tokens. Clean values are i.i.d. N(0, 1) (unit-variance like normalised VAE
// latents, so a zero prediction scores E[(eps - x0)^2] = 2 per modality, loss 4), drawn per
// sample from a generator seeded by (seed, sample index): video, then audio, then text.
struct MagiHumanDataFixture {
  int64_t samples = 8;
  std::array<int64_t, 3> video_grid = {32, 8, 15};  // (T, H', W')
  int64_t audio_tokens = 126;
  int64_t text_tokens = 640;
  int64_t video_channels = 192;
  int64_t audio_channels = 64;
  int64_t text_channels = 3584;
  std::string format = "pt";  // pt (torch.save zip, loadable by torch.load(weights_only=True)) | safetensors
  uint64_t seed = 0;
};
void fixture_magihuman_data(const std::string& out_dir, const MagiHumanDataFixture& options);
// "T,H,W" -> {T, H, W} (all >= 1), for --video-grid.
std::array<int64_t, 3> parse_video_grid(const std::string& text);

// Random weights for the config's model.config in the public HF `base/` layout: shards
// model-0000i-of-0000K.safetensors split by cumulative bytes plus model.safetensors.index.json.
// Names, shapes and on-disk dtypes are hf_tensor_specs (bf16 linears and biases, fp32 norms and
// bands); every tensor is N(0, 0.02) (norms too: the model uses 1 + w) except adapter.rope.bands
// = 1 / 10000^(k / bands) exactly; up_gate_proj rows are interleaved as on disk (invisible with
// random values). Each tensor comes from its own generator (seed, tensor index), so the values do
// not depend on the shard count. At most one shard is held in memory. shards 0 = min(7, tensors).
void fixture_magihuman_weights(const std::string& config_path, const std::string& out_dir, int64_t shards,
                               uint64_t seed);

// A tiny image-text SFT set for mistral3 in the "huggingface" dataset layout: out_dir/tekken.json
// (byte-level: 20 control tokens + 256 bytes, vocab 276), out_dir/images/*.png (solid colours,
// sides in [min_side, max_side]), out_dir/conversations.json (LLaVA style; a quarter of the
// records hold two images). bad_records appends one record per drop reason (missing image,
// corrupt image, no assistant turn, <image> count mismatch, malformed, and an image after a
// prompt of long_prompt_bytes that truncation cuts).
struct Mistral3DataFixture {
  int64_t samples = 64;
  int64_t min_side = 8;
  int64_t max_side = 40;
  bool bad_records = false;
  int64_t long_prompt_bytes = 600;
  uint64_t seed = 0;
};
void fixture_mistral3_data(const std::string& out_dir, const Mistral3DataFixture& options);

}  // namespace mmtrain
