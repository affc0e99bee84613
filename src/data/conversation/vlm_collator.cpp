#include "data/conversation/vlm_collator.h"

#include "core/error.h"
#include "core/param_map.h"
#include "data/image/pixtral_image.h"

#include <algorithm>

namespace mmtrain::conversation {
namespace {

// Mistral's <pad> (tekken id 11), the default for the seed's Magistral runs. Any valid id would
// do: padded positions carry label -100 and follow every real token of their row.
constexpr int64_t kDefaultPadTokenId = 11;

void append_images(const Batch& sample, std::vector<at::Tensor>& pixels, std::vector<at::Tensor>& sizes) {
  auto it = sample.find("pixel_values");
  if (it == sample.end()) return;
  pixels.push_back(it->second);
  sizes.push_back(batch_get(sample, "image_sizes"));
}

void put_images(const std::vector<at::Tensor>& pixels, const std::vector<at::Tensor>& sizes, Batch& out) {
  if (pixels.empty()) return;
  out["pixel_values"] = image::concat_padded_images(pixels);
  out["image_sizes"] = at::cat(sizes);
}

}  // namespace

Batch VlmCollator::collate(const std::vector<Batch>& samples, at::Generator&) const {
  if (samples.empty()) fail("pixtral collator: empty micro-batch");
  std::vector<at::Tensor> pixels, sizes;
  Batch out;
  if (samples[0].count("cu_seqlens")) {
    if (samples.size() != 1)
      fail("pixtral collator: packed rows need training.micro_batch_size 1 (one packed row per micro-batch), got ",
           samples.size(), " rows");
    const auto& s = samples[0];
    const auto cu = batch_get(s, "cu_seqlens");
    const int64_t length = batch_get(s, "input_ids").size(0);
    auto segments = at::empty({length}, at::kLong);
    for (int64_t i = 0; i + 1 < cu.size(0); ++i) {
      const int64_t begin = cu[i].item<int64_t>(), end = cu[i + 1].item<int64_t>();
      segments.narrow(0, begin, end - begin).fill_(i + 1);
    }
    out = {{"input_ids", batch_get(s, "input_ids").unsqueeze(0)},
           {"labels", batch_get(s, "labels").unsqueeze(0)},
           {"position_ids", batch_get(s, "position_ids").unsqueeze(0)},
           {"attention_mask", segments.unsqueeze(0)},
           {"cu_seqlens", cu}};
    append_images(s, pixels, sizes);
    put_images(pixels, sizes, out);
    return out;
  }
  int64_t longest = 0;
  for (const auto& s : samples) longest = std::max(longest, batch_get(s, "input_ids").size(0));
  const int64_t rows = static_cast<int64_t>(samples.size());
  auto ids = at::full({rows, longest}, pad_token_id_, at::kLong);
  auto labels = at::full({rows, longest}, -100, at::kLong);
  auto mask = at::zeros({rows, longest}, at::kLong);
  auto positions = at::zeros({rows, longest}, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& s = samples[r];
    const int64_t length = batch_get(s, "input_ids").size(0);
    ids[r].narrow(0, 0, length).copy_(batch_get(s, "input_ids"));
    labels[r].narrow(0, 0, length).copy_(batch_get(s, "labels"));
    mask[r].narrow(0, 0, length).fill_(1);
    positions[r].narrow(0, 0, length).copy_(at::arange(length, at::kLong));
    append_images(s, pixels, sizes);
  }
  out = {{"input_ids", ids}, {"labels", labels}, {"attention_mask", mask}, {"position_ids", positions}};
  put_images(pixels, sizes, out);
  return out;
}

namespace {

// The seed's collator_id for Magistral; it serves any VLM's conversation items.
const CollatorRegistration collator("pixtral", [](const DataConfig& data, const ModelConfig&) {
  const ParamMap p(data.loader.collate_param, "data.dataloader_param.collate_param", "collator pixtral");
  p.check_known_keys({"model_name", "pad_token_id"});
  const int64_t pad = p.get_int("pad_token_id", kDefaultPadTokenId);
  if (pad < 0) fail(p.where("pad_token_id"), ": expected an integer >= 0, found ", pad);
  return std::make_shared<VlmCollator>(pad);
});

}  // namespace

}  // namespace mmtrain::conversation
