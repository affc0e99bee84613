// After truncation, do a sample's image tokens still match its images? (the seed's PixtralPlugin.validate_input_ids). Truncation can cut inside an image's
// [IMG]...[IMG_END] block or drop a later turn that held an <image>; either way the [IMG] count no
// longer equals the projector's features and the forward pass would fail. The dataset drops such
// samples (never patches them) and counts why.
#pragma once
#include "data/image/pixtral_image.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain::conversation {

// The tokenizer's ids of the image processor's three image tokens (ImageProcessor::token_names).
struct ImageTokenIds {
  int32_t image = 0;
  int32_t row_break = 0;
  int32_t end = 0;
};

// Empty when input_ids hold, in order, exactly one block
// ([IMG] x cols + [IMG_BREAK]) x (rows - 1) + [IMG] x cols + [IMG_END] per layout, no other
// image-class token, and every one of those positions has label -100. Otherwise a short reason
// ("3 of 4 image blocks", "image 2 block cut after 17 of 30 tokens", ...).
std::string check_image_tokens(const std::vector<int32_t>& input_ids, const std::vector<int32_t>& labels,
                               const std::vector<image::ImageTokenLayout>& layouts, const ImageTokenIds& ids);

}  // namespace mmtrain::conversation
