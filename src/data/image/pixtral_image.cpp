// Pixtral resize rule, normalisation and image-token layout; see pixtral_image.h.
#include "data/image/pixtral_image.h"

#include "core/error.h"
#include "data/image/pil_resize.h"

#include <cmath>

namespace mmtrain::image {

void PixtralImageConfig::validate() const {
  if (patch_size < 1) fail("pixtral image config: patch_size must be >= 1, found ", patch_size);
  if (spatial_merge_size < 1) fail("pixtral image config: spatial_merge_size must be >= 1, found ", spatial_merge_size);
  if (longest_edge < 1) fail("pixtral image config: longest_edge must be >= 1, found ", longest_edge);
  if (!(rescale_factor > 0.0)) fail("pixtral image config: rescale_factor must be > 0, found ", rescale_factor);
  for (int c = 0; c < 3; ++c) {
    if (image_std[c] == 0.0 || !std::isfinite(image_std[c]))
      fail("pixtral image config: image_std[", c, "] must be finite and non-zero, found ", image_std[c]);
    if (!std::isfinite(image_mean[c])) fail("pixtral image config: image_mean[", c, "] must be finite");
  }
}

ImageSize pixtral_resize_size(int64_t height, int64_t width, const PixtralImageConfig& config) {
  config.validate();
  if (height < 1 || width < 1) fail("pixtral resize: image is ", height, "x", width, " pixels, expected at least 1x1");
  // Python: ratio = max(h / max_h, w / max_w); int/int true division is a correctly rounded
  // double, as is this, so floor(h / ratio) agrees bit for bit (e.g. 4000x3000 -> 1540x1155).
  const double edge = static_cast<double>(config.longest_edge);
  const double ratio = std::max(static_cast<double>(height) / edge, static_cast<double>(width) / edge);
  if (ratio > 1.0) {
    height = static_cast<int64_t>(std::floor(static_cast<double>(height) / ratio));
    width = static_cast<int64_t>(std::floor(static_cast<double>(width) / ratio));
  }
  // A 1x4000 strip floors its short side to 0; HF then yields ((0 - 1) // P + 1) * P = 0 too, and
  // PIL refuses a 0-pixel resize, so both fail, here with the reason.
  if (height < 1 || width < 1)
    fail("pixtral resize: a ", height, "x", width, " image after fitting into longest_edge ", config.longest_edge,
         " (aspect ratio too extreme)");
  const int64_t m = config.resize_multiple();
  return {((height - 1) / m + 1) * m, ((width - 1) / m + 1) * m};
}

at::Tensor pixtral_normalize(const at::Tensor& rgb, const PixtralImageConfig& config) {
  config.validate();
  if (rgb.dim() != 3 || rgb.size(2) != 3 || rgb.scalar_type() != at::kByte)
    fail("pixtral normalize: expected uint8 [H, W, 3], found ", rgb.scalar_type(), " ", rgb.sizes());
  const auto src = rgb.contiguous();
  const int64_t h = src.size(0), w = src.size(1), plane = h * w;
  auto out = at::empty({3, h, w}, at::kFloat);
  const uint8_t* in = src.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  for (int c = 0; c < 3; ++c) {
    // numpy: rescale in float64 then cast to float32; mean/std become float32 arrays and the
    // normalisation runs in float32. A 256-entry table per channel gives the same values.
    const float mean = static_cast<float>(config.image_mean[c]);
    const float stdev = static_cast<float>(config.image_std[c]);
    float table[256];
    for (int v = 0; v < 256; ++v) {
      const float x = static_cast<float>(static_cast<double>(v) * config.rescale_factor);
      table[v] = (x - mean) / stdev;
    }
    float* dst = o + c * plane;
    for (int64_t i = 0; i < plane; ++i) dst[i] = table[in[i * 3 + c]];
  }
  return out;
}

at::Tensor pixtral_preprocess(const at::Tensor& rgb, const PixtralImageConfig& config) {
  if (rgb.dim() != 3 || rgb.size(2) != 3 || rgb.scalar_type() != at::kByte)
    fail("pixtral preprocess: expected uint8 [H, W, 3], found ", rgb.scalar_type(), " ", rgb.sizes());
  const auto size = pixtral_resize_size(rgb.size(0), rgb.size(1), config);
  return pixtral_normalize(resize_bicubic_pil(rgb, size.height, size.width), config);
}

std::vector<int64_t> ImageTokenLayout::token_ids(int64_t image_id, int64_t break_id, int64_t end_id) const {
  if (rows < 1 || cols < 1) fail("image token layout: ", rows, " rows x ", cols, " cols has no tokens");
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(total_tokens()));
  for (int64_t r = 0; r < rows; ++r) {
    ids.insert(ids.end(), static_cast<size_t>(cols), image_id);
    ids.push_back(r + 1 < rows ? break_id : end_id);
  }
  return ids;
}

ImageTokenLayout image_token_layout(int64_t height, int64_t width, const PixtralImageConfig& config) {
  config.validate();
  if (height < 1 || width < 1) fail("image token layout: image is ", height, "x", width, " pixels, expected at least 1x1");
  const int64_t m = config.merged_patch();
  ImageTokenLayout layout{height / m, width / m};
  if (layout.rows < 1 || layout.cols < 1)
    fail("image token layout: a ", height, "x", width, " image gives ", layout.rows, "x", layout.cols,
         " merged patches (", m, " pixels each): no image tokens; resize it first (pixtral_resize_size)");
  return layout;
}

at::Tensor concat_padded_images(const std::vector<at::Tensor>& images) {
  if (images.empty()) fail("concat_padded_images: no images");
  int64_t max_h = 0, max_w = 0;
  for (const auto& batch : images) {
    if (batch.dim() != 4) fail("concat_padded_images: expected [n, C, H, W], found ", batch.sizes());
    max_h = std::max(max_h, batch.size(2));
    max_w = std::max(max_w, batch.size(3));
  }
  std::vector<at::Tensor> padded;
  for (const auto& batch : images)
    padded.push_back(at::constant_pad_nd(batch, {0, max_w - batch.size(3), 0, max_h - batch.size(2)}));
  return at::cat(padded);
}

}  // namespace mmtrain::image
