#include "data/conversation/vlm_collator.h"

#include "core/error.h"
#include "core/param_map.h"
#include "data/image/pixtral_image.h"

#include <algorithm>

namespace mmtrain::conversation {
namespace {


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

// The samples one after another in one row [1, T]: input_ids, labels, position_ids (0.. within
// each conversation), attention_mask (segment ids 1..k) and cu_seqlens [k + 1]. A packed item
// brings its own segments. Each conversation's first label is -100: in a row of its own it is
// never predicted (position t predicts labels[t + 1]), and here it must not be predicted from the
// conversation before it.
Batch pack_samples(const std::vector<Batch>& samples) {
  std::vector<at::Tensor> ids, labels, positions, segments, pixels, sizes;
  std::vector<int64_t> cu{0};
  for (const auto& s : samples) {
    const auto& item_ids = batch_get(s, "input_ids");
    const int64_t length = item_ids.size(0), offset = cu.back();
    std::vector<int64_t> item_cu = {0, length};
    if (s.count("cu_seqlens")) {
      const auto given = batch_get(s, "cu_seqlens").to(at::kLong).contiguous();
      item_cu.assign(given.data_ptr<int64_t>(), given.data_ptr<int64_t>() + given.numel());
    }
    auto item_labels = batch_get(s, "labels").clone();
    auto item_positions = at::empty({length}, at::kLong);
    auto item_segments = at::empty({length}, at::kLong);
    for (size_t k = 0; k + 1 < item_cu.size(); ++k) {
      const int64_t begin = item_cu[k], size = item_cu[k + 1] - item_cu[k];
      item_labels[begin].fill_(-100);
      item_positions.narrow(0, begin, size).copy_(at::arange(size, at::kLong));
      item_segments.narrow(0, begin, size).fill_(static_cast<int64_t>(cu.size()));
      cu.push_back(offset + item_cu[k + 1]);
    }
    ids.push_back(item_ids);
    labels.push_back(item_labels);
    positions.push_back(item_positions);
    segments.push_back(item_segments);
    append_images(s, pixels, sizes);
  }
  Batch out = {{"input_ids", at::cat(ids).unsqueeze(0)},
               {"labels", at::cat(labels).unsqueeze(0)},
               {"position_ids", at::cat(positions).unsqueeze(0)},
               {"attention_mask", at::cat(segments).unsqueeze(0)},
               {"cu_seqlens", at::tensor(cu, at::kLong)}};
  put_images(pixels, sizes, out);
  return out;
}

}  // namespace

Batch VlmCollator::collate(const std::vector<Batch>& samples, std::vector<at::Generator>&) const {
  if (samples.empty()) fail("pixtral collator: empty micro-batch");
  if (!pack_ && samples[0].count("cu_seqlens") && samples.size() != 1)
    fail("pixtral collator: packed rows need training.micro_batch_size 1 (one packed row per micro-batch), got ",
         samples.size(), " rows");
  if (pack_ || samples[0].count("cu_seqlens")) return pack_samples(samples);
  std::vector<at::Tensor> pixels, sizes;
  Batch out;
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

int64_t collate_pad_token_id(const DataConfig& data, const std::string& collator) {
  const ParamMap p(data.loader.collate_param, "data.dataloader_param.collate_param", "collator " + collator);
  p.check_known_keys({"model_name", "pad_token_id"});
  const int64_t pad = p.get_int("pad_token_id", kDefaultPadTokenId);
  if (pad < 0) fail(p.where("pad_token_id"), ": expected an integer >= 0, found ", pad);
  return pad;
}

namespace {

// The seed's collator_id for Magistral; it serves any VLM's conversation items.
const CollatorRegistration collator("pixtral", [](const DataConfig& data, const ModelConfig&) {
  // A token budget counts the tokens computed: a padded micro-batch would compute more.
  return std::make_shared<VlmCollator>(collate_pad_token_id(data, "pixtral"), /*pack=*/data.loader.micro_batch_tokens > 0);
});

}  // namespace

}  // namespace mmtrain::conversation
