// `mmtrain debug image`: decode -> Pixtral resize/normalise -> token layout on one image; see
// debug_image.h.
#include "debugging/debug_image.h"

#include "data/image/image_decode.h"
#include "data/image/pil_resize.h"
#include "data/image/pixtral_image.h"
#include "io/safetensors.h"

#include <filesystem>
#include <utility>
#include <vector>

namespace mmtrain {

void debug_image(const std::string& in_path, const std::string& out_path, const DebugImageOptions& options) {
  image::PixtralImageConfig config;
  config.align_to_merged_patch = !options.align_to_patch;
  const auto rgb = image::decode_image_file(in_path);
  const auto size = image::pixtral_resize_size(rgb.size(0), rgb.size(1), config);
  const auto pixels = image::pixtral_normalize(image::resize_bicubic_pil(rgb, size.height, size.width), config);
  const auto layout = image::image_token_layout(size.height, size.width, config);
  const auto ids = layout.token_ids(image::kImageTokenId, image::kImageBreakTokenId, image::kImageEndTokenId);

  std::vector<std::pair<std::string, at::Tensor>> tensors{
      {"pixel_values", pixels},
      {"image_size", at::tensor({size.height, size.width}, at::kLong)},
      {"rows", at::scalar_tensor(layout.rows, at::kLong)},
      {"cols", at::scalar_tensor(layout.cols, at::kLong)},
      {"input_ids", at::tensor(ids, at::kLong)},
  };
  if (options.with_decoded) tensors.emplace_back("decoded", rgb);
  const auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  safetensors_write(out_path, tensors, {{"source", in_path}, {"align", options.align_to_patch ? "patch" : "merged"}});
}

}  // namespace mmtrain
