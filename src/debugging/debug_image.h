// `mmtrain debug image --in IMG --out OUT.safetensors`: the Pixtral image pipeline of
// src/data/image/ on one file, for the parity test against HF's PixtralImageProcessor
// (tests/parity/test_image_pipeline.py). Writes
//   pixel_values [3, H', W'] fp32   normalised pixels after the Pixtral resize
//   image_size   [2] int64          (H', W')
//   rows, cols   0-dim int64        the [IMG] grid after the spatial merge
//   input_ids    [rows*(cols+1)] int64   the expansion with [IMG]=10, [IMG_BREAK]=12, [IMG_END]=13
//   decoded      [H, W, 3] uint8    (only with --with-decoded) the RGB image before resizing
// and metadata source, align ("merged": multiples of patch*merge, "patch": multiples of patch).
#pragma once
#include <string>

namespace mmtrain {

struct DebugImageOptions {
  bool align_to_patch = false;  // LLaMA-Factory / MindSpeed-MM rounding (multiples of 14)
  bool with_decoded = false;
};

void debug_image(const std::string& in_path, const std::string& out_path, const DebugImageOptions& options);

}  // namespace mmtrain
