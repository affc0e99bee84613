#include "data/conversation/image_token_check.h"

namespace mmtrain::conversation {

std::string check_image_tokens(const std::vector<int32_t>& input_ids, const std::vector<int32_t>& labels,
                               const std::vector<image::ImageTokenLayout>& layouts, const ImageTokenIds& ids) {
  auto is_image_class = [&](int32_t id) { return id == ids.image || id == ids.row_break || id == ids.end; };
  const size_t n = input_ids.size();
  size_t pos = 0, image = 0;
  while (true) {
    while (pos < n && !is_image_class(input_ids[pos])) ++pos;
    if (pos == n) break;
    if (image == layouts.size())
      return "image tokens at position " + std::to_string(pos) + " beyond the " + std::to_string(layouts.size()) +
             " image blocks expected";
    const auto expected = layouts[image].token_ids(ids.image, ids.row_break, ids.end);
    size_t matched = 0;
    while (matched < expected.size() && pos + matched < n && input_ids[pos + matched] == expected[matched]) ++matched;
    if (matched < expected.size())
      return "image " + std::to_string(image + 1) + " block cut after " + std::to_string(matched) + " of " +
             std::to_string(expected.size()) + " tokens";
    for (size_t k = 0; k < matched; ++k)
      if (labels[pos + k] != -100) return "image " + std::to_string(image + 1) + " tokens are supervised";
    pos += matched;
    ++image;
  }
  if (image != layouts.size())
    return std::to_string(image) + " of " + std::to_string(layouts.size()) + " image blocks left in the sequence";
  return {};
}

}  // namespace mmtrain::conversation
