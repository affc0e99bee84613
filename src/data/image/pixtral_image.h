// The Pixtral image pipeline of Magistral-Small-2509 / Mistral-Small-3.x (Mistral3), as HF's
// PixtralProcessor drives PixtralImageProcessor (docs/image_pipeline.md):
//   decode -> RGB uint8 (image_decode.h)
//   size:   ratio = max(H, W) / longest_edge; if ratio > 1, H = floor(H / ratio), W likewise;
//           then each side rounded UP to a multiple of M (stretching, so tiny images upscale),
//           M = patch_size * spatial_merge_size = 28 (the official processor: the patch grid is
//           always even) or patch_size = 14 (LLaMA-Factory / MindSpeed-MM call the image
//           processor directly; an odd grid's last row/column is dropped by the PatchMerger);
//   resize: Pillow bicubic on uint8 (pil_resize.h), bit-exact with the PIL-backed processor;
//   pixels: float32(u8 * (1/255) in double), then (x - mean) / std in float32, as numpy does
//           -> float32 [3, H', W'].
// Image tokens, counted after the 2x2 merge: rows = H' / (patch * merge), cols = W' / (patch *
// merge) (floor); the placeholder expands to rows x ([IMG] * cols, [IMG_BREAK]) with the last
// [IMG_BREAK] replaced by [IMG_END]: rows*cols [IMG] (= the projector's features), rows - 1
// [IMG_BREAK], one [IMG_END], rows * (cols + 1) in all.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain::image {

// What the image processor config of the checkpoint says (processor_config.json /
// preprocessor_config.json of Mistral-Small-3.x: patch_size 14, longest_edge 1540, CLIP mean/std)
// plus the model's spatial_merge_size. Defaults are Magistral-Small-2509's.
struct PixtralImageConfig {
  int64_t patch_size = 14;
  int64_t spatial_merge_size = 2;
  int64_t longest_edge = 1540;
  // true: sides are multiples of patch_size * spatial_merge_size (HF PixtralProcessor, the
  // official path); false: multiples of patch_size (LLaMA-Factory / MindSpeed-MM). Token counts
  // differ between the two (a 640x480 image: 432 tokens officially, 408 with LLaMA-Factory's sizing).
  bool align_to_merged_patch = true;
  double rescale_factor = 1.0 / 255.0;
  std::array<double, 3> image_mean{0.48145466, 0.4578275, 0.40821073};
  std::array<double, 3> image_std{0.26862954, 0.26130258, 0.27577711};

  int64_t resize_multiple() const { return align_to_merged_patch ? patch_size * spatial_merge_size : patch_size; }
  int64_t merged_patch() const { return patch_size * spatial_merge_size; }
  // Fails naming the field when a value is unusable (non-positive sizes, std of 0).
  void validate() const;
};

struct ImageSize {
  int64_t height = 0;
  int64_t width = 0;
};

// HF `get_resize_output_image_size` (Pixtral) with patch = config.resize_multiple(): the
// (height, width) an image of height x width pixels is resized to. Fails for a side < 1.
ImageSize pixtral_resize_size(int64_t height, int64_t width, const PixtralImageConfig& config);

// rgb uint8 [H, W, 3] -> float32 [3, H, W]: (float32(u8 * rescale_factor) - mean) / std per channel.
at::Tensor pixtral_normalize(const at::Tensor& rgb, const PixtralImageConfig& config);

// rgb uint8 [H, W, 3] -> float32 [3, H', W'] (H', W' = pixtral_resize_size(H, W)).
at::Tensor pixtral_preprocess(const at::Tensor& rgb, const PixtralImageConfig& config);

// The [IMG] grid of one image after the spatial merge.
struct ImageTokenLayout {
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t image_tokens() const { return rows * cols; }    // [IMG] count = projector features
  int64_t total_tokens() const { return rows * (cols + 1); }  // + rows-1 [IMG_BREAK] + [IMG_END]
  // The expansion: for each row, cols x image_id then break_id; the last break_id becomes end_id.
  std::vector<int64_t> token_ids(int64_t image_id, int64_t break_id, int64_t end_id) const;
};

// Magistral / Mistral-Small-3.x tekken ids ([IMG] 10, [IMG_BREAK] 12, [IMG_END] 13); read them from
// tekken.json where available.
constexpr int64_t kImageTokenId = 10, kImageBreakTokenId = 12, kImageEndTokenId = 13;

// Layout of an image already resized to height x width (pixtral_resize_size's output):
// rows = height / (patch * merge), cols = width / (patch * merge). Fails when either is 0 (an
// image smaller than one merged patch gives no features) or a side is < 1.
ImageTokenLayout image_token_layout(int64_t height, int64_t width, const PixtralImageConfig& config);

// Batches of images [n_i, C, H_i, W_i] -> one [sum n_i, C, max H_i, max W_i], each zero-padded
// at the bottom and right: the pixel_values layout the model reads with image_sizes.
at::Tensor concat_padded_images(const std::vector<at::Tensor>& images);

}  // namespace mmtrain::image
