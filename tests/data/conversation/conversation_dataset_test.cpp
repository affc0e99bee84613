// The Magistral data path: chat template + labels, LLaMA-Factory truncation, the image-token check,
// greedy_knapsack, and the "huggingface" dataset + "pixtral" collator on `fixture mistral3` data
// (byte-level tekken: an ordinary byte b has id 20 + b).
#include "config/config.h"
#include "data/chat/mistral_chat.h"
#include "data/conversation/conversation_dataset.h"
#include "data/conversation/vlm_collator.h"
#include "test_util.h"
#include "data/mistral3/fixture.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <stb/stb_image_write.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace mmtrain {
namespace {
namespace fs = std::filesystem;
using mmtrain::testing::error_of;

constexpr int32_t kBos = 1, kEos = 2, kInst = 3, kInstEnd = 4, kImg = 10, kBreak = 12, kEnd = 13, kSys = 17, kSysEnd = 18;

std::vector<int32_t> bytes(const std::string& text) {
  std::vector<int32_t> out;
  for (unsigned char c : text) out.push_back(20 + c);
  return out;
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// One fixture directory per test binary run.
const fs::path& fixture_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("mmtrain_m3_data_" + std::to_string(::getpid()));
    mistral3::Mistral3DataFixture o;
    o.samples = 12;
    o.bad_records = true;
    mistral3::fixture_mistral3_data(d.string(), o);
    return d;
  }();
  return dir;
}

std::shared_ptr<const tokenizer::TextTokenizer> fixture_tokenizer() {
  return tokenizer::load_text_tokenizer((fixture_dir() / "tekken.json").string());
}

TEST(MistralChat, EncodesSystemTurnsImagesAndLabels) {
  chat::MistralChatTemplate tmpl(fixture_tokenizer());
  chat::Conversation conv{"Be brief.", {{"<image>\nQ?", "A.  "}, {"More", "B"}}};
  const std::vector<int32_t> image = {kImg, kImg, kBreak, kImg, kImg, kEnd};
  const auto turns = tmpl.encode(conv, {image});
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_EQ(turns[0].source, cat({{kBos, kSys}, bytes("Be brief."), {kSysEnd, kInst}, image, bytes("\nQ?"), {kInstEnd}}));
  EXPECT_EQ(turns[0].target, cat({bytes("A."), {kEos}}));  // trailing spaces stripped
  EXPECT_EQ(turns[1].source, cat({{kInst}, bytes("More"), {kInstEnd}}));
  EXPECT_EQ(turns[1].target, cat({bytes("B"), {kEos}}));

  const auto seq = chat::truncate_turns(turns, 0);
  ASSERT_EQ(seq.input_ids.size(), seq.labels.size());
  std::vector<int32_t> expected_labels(turns[0].source.size(), -100);
  expected_labels.insert(expected_labels.end(), turns[0].target.begin(), turns[0].target.end());
  expected_labels.insert(expected_labels.end(), turns[1].source.size(), -100);
  expected_labels.insert(expected_labels.end(), turns[1].target.begin(), turns[1].target.end());
  EXPECT_EQ(seq.labels, expected_labels);

  // No system message and no default: no system block; a default system fills in.
  EXPECT_EQ(tmpl.encode({"", {{"x", "y"}}}, {})[0].source, cat({{kBos, kInst}, bytes("x"), {kInstEnd}}));
  chat::MistralChatTemplate with_default(fixture_tokenizer(), "D");
  EXPECT_EQ(with_default.encode({"", {{"x", "y"}}}, {})[0].source,
            cat({{kBos, kSys}, bytes("D"), {kSysEnd, kInst}, bytes("x"), {kInstEnd}}));
  // Control-token text in user content stays text (tekken never parses it).
  EXPECT_EQ(tmpl.encode({"", {{"[INST]", "y"}}}, {})[0].source, cat({{kBos, kInst}, bytes("[INST]"), {kInstEnd}}));
}

TEST(MistralChat, RefusesPlaceholderImageMismatch) {
  chat::MistralChatTemplate tmpl(fixture_tokenizer());
  EXPECT_CONTAINS(error_of([&] { tmpl.encode({"", {{"<image><image>", "a"}}}, {{kImg, kEnd}}); }),
                  "2 \"<image>\" placeholders but 1 images");
}

TEST(MistralChat, TruncatesLikeLlamaFactoryInferSeqlen) {
  std::vector<chat::EncodedTurn> turns(2);
  turns[0].source.assign(10, 100);
  turns[0].target.assign(4, 200);
  turns[1].source.assign(3, 300);
  turns[1].target.assign(3, 400);
  // c = 8: 4*2 < 8 no, 10*2 < 8 no -> max_target = int(8 * 4 / 14) = 2, source = 6; turn 2 dropped.
  auto seq = chat::truncate_turns(turns, 8);
  EXPECT_EQ(seq.input_ids, std::vector<int32_t>({100, 100, 100, 100, 100, 100, 200, 200}));
  EXPECT_EQ(seq.dropped_turns, 1);
  // c = 30: everything fits, nothing cut.
  seq = chat::truncate_turns(turns, 30);
  EXPECT_EQ(seq.input_ids.size(), 20u);
  EXPECT_EQ(seq.dropped_turns, 0);
  // c = 16: turn 1 whole (14, since 4*2 < 16), turn 2 gets c = 2: 3*2 < 2 no, 3*2 < 2 no ->
  // max_target = int(2 * 3 / 6) = 1, source = 1.
  seq = chat::truncate_turns(turns, 16);
  ASSERT_EQ(seq.input_ids.size(), 16u);
  EXPECT_EQ(seq.input_ids[14], 300);
  EXPECT_EQ(seq.input_ids[15], 400);
  EXPECT_EQ(seq.labels[14], -100);
  EXPECT_EQ(seq.labels[15], 400);
}

TEST(ImageTokenCheck, AcceptsWholeBlocksOnly) {
  const std::vector<image::ImageTokenLayout> layouts = {{2, 2}, {1, 3}};
  const std::vector<int32_t> a = {kImg, kImg, kBreak, kImg, kImg, kEnd}, b = {kImg, kImg, kImg, kEnd};
  const auto ids = cat({{kBos, kInst}, a, {50}, b, {kInstEnd, 60, kEos}});
  std::vector<int32_t> labels(ids.size(), -100);
  labels[labels.size() - 2] = 60;
  const conversation::ImageTokenIds tok{kImg, kBreak, kEnd};
  EXPECT_EQ(conversation::check_image_tokens(ids, labels, layouts, tok), "");
  // Cut inside the second block (truncation at the tail).
  std::vector<int32_t> cut(ids.begin(), ids.begin() + 2 + 6 + 1 + 2);
  EXPECT_EQ(conversation::check_image_tokens(cut, std::vector<int32_t>(cut.size(), -100), layouts, tok),
            "image 2 block cut after 2 of 4 tokens");
  // The second image's block is gone entirely.
  std::vector<int32_t> one(ids.begin(), ids.begin() + 2 + 6);
  EXPECT_EQ(conversation::check_image_tokens(one, std::vector<int32_t>(one.size(), -100), layouts, tok),
            "1 of 2 image blocks left in the sequence");
  // A supervised image token.
  auto bad_labels = labels;
  bad_labels[3] = kImg;
  EXPECT_EQ(conversation::check_image_tokens(ids, bad_labels, layouts, tok), "image 1 tokens are supervised");
  // A stray [IMG] beyond the images.
  auto extra = cat({ids, {kImg}});
  EXPECT_CONTAINS(conversation::check_image_tokens(extra, std::vector<int32_t>(extra.size(), -100), layouts, tok),
                  "beyond the 2 image blocks");
}

TEST(GreedyKnapsack, FillsBinsLikeLlamaFactory) {
  // Sorted [2, 3, 5, 7, 8]: bin 1 takes 8 then 2; bin 2 takes 7 then 3; bin 3 takes 5.
  EXPECT_EQ(conversation::greedy_knapsack({5, 3, 8, 2, 7}, 10),
            (std::vector<std::vector<int64_t>>{{2, 3}, {4, 1}, {0}}));
  EXPECT_CONTAINS(error_of([] { conversation::greedy_knapsack({11}, 10); }), "exceeds the capacity 10");
}

Config data_config(const std::string& extra_basic = "", int64_t cutoff = 256) {
  const auto dir = fixture_dir().string();
  return config_from_yaml_string(R"(
model:
  model_id: mistral3
  config:
    text_config: {vocab_size: 288, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8, intermediate_size: 48}
    vision_config: {hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 24, patch_size: 4, image_size: 32, hidden_act: silu}
data:
  dataset_param:
    dataset_type: huggingface
    preprocess_parameters: {model_name_or_path: )" + dir + R"(/tekken.json}
    basic_parameters:
      dataset: )" + dir + R"(/conversations.json
      cutoff_len: )" + std::to_string(cutoff) + "\n" + extra_basic + R"(
  dataloader_param:
    collator_id: pixtral
training: {micro_batch_size: 3, train_iters: 1}
)", "test");
}

conversation::ConversationDataOptions options_of(const Config& c) {
  return conversation::ConversationDataOptions::from_config(c.data, c.model);
}

TEST(ConversationDataset, DropsEachBadRecordForItsReason) {
  conversation::ConversationDataset ds(options_of(data_config()));
  EXPECT_EQ(ds.records(), 18);
  EXPECT_EQ(ds.size(), 12);
  const std::map<std::string, int64_t> expected = {
      {"<image> count differs from the image list", 1}, {"image file missing", 1}, {"image file unreadable", 1},
      {"image tokens cut by truncation", 1}, {"malformed record (no \"conversations\" or \"messages\" list)", 1},
      {"no assistant turn", 1}};
  EXPECT_EQ(ds.dropped(), expected);
  EXPECT_CONTAINS(ds.summary(), "18 records, 12 kept, 6 dropped");
  // Without truncation the long-prompt record is whole and kept.
  conversation::ConversationDataset uncut(options_of(data_config("", 0)));
  EXPECT_EQ(uncut.size(), 13);
}

TEST(ConversationDataset, AJsonObjectIsNotCalledInvalidJson) {
  const fs::path file = fs::temp_directory_path() / ("mmtrain_m3_object_" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << "{\n  \"conversations\": []\n}\n";
  auto config = data_config();
  config.data.dataset_param["basic_parameters"]["dataset"] = file.string();
  EXPECT_CONTAINS(error_of([&] { conversation::ConversationDataset ds(options_of(config)); }),
                  "dataset " + file.string() + ": one JSON object, expected a list of records");
  fs::remove(file);
}

TEST(ConversationDataset, NegativeCutoffIsRefused) {
  EXPECT_CONTAINS(error_of([] { options_of(data_config("", -1)); }),
                  "data.dataset_param.basic_parameters.cutoff_len: expected >= 0 (0 = no truncation), found -1");
}

// Images that are not regular files (a directory, a FIFO, a link to a device, an empty path) and
// one that resizes to nothing (1x4000) are named, counted skips, not "missing" or the end of the run.
TEST(ConversationDataset, IrregularImagesAreNamedSkips) {
  const fs::path dir = fs::temp_directory_path() / ("mmtrain_m3_irregular_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "images" / "a_directory.png");
  fs::copy_file(fixture_dir() / "tekken.json", dir / "tekken.json");
  ASSERT_EQ(::mkfifo((dir / "images" / "fifo.png").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir / "images" / "zero.png");
  std::vector<uint8_t> thin(3 * 4000, 200);
  ASSERT_NE(stbi_write_png((dir / "images" / "thin.png").c_str(), 4000, 1, 3, thin.data(), 3 * 4000), 0);
  const nlohmann::json ask = {{"from", "human"}, {"value", "<image>\nQ"}};
  const nlohmann::json answer = {{"from", "gpt"}, {"value", "A"}};
  nlohmann::json records = nlohmann::json::array();
  for (const char* image : {"images/a_directory.png", "images/fifo.png", "images/zero.png", "", "images/thin.png",
                            "images/gone.png"})
    records.push_back({{"id", image}, {"image", image}, {"conversations", nlohmann::json::array({ask, answer})}});
  const nlohmann::json plain_ask = {{"from", "human"}, {"value", "Q"}};
  records.push_back({{"id", "plain"}, {"conversations", nlohmann::json::array({plain_ask, answer})}});
  std::ofstream(dir / "conversations.json") << records.dump();

  auto config = data_config();
  config.data.dataset_param["preprocess_parameters"]["model_name_or_path"] = (dir / "tekken.json").string();
  config.data.dataset_param["basic_parameters"]["dataset"] = (dir / "conversations.json").string();
  conversation::ConversationDataset ds(options_of(config));
  EXPECT_EQ(ds.size(), 1);
  const std::map<std::string, int64_t> expected = {
      {"image not a regular file", 4}, {"image file missing", 1}, {"image file unreadable", 1}};
  EXPECT_EQ(ds.dropped(), expected);
  fs::remove_all(dir);
}

// Every [IMG] of a sample has a feature: sum over images of (H/8)*(W/8) for patch 4, merge 2.
int64_t expected_image_tokens(const at::Tensor& image_sizes) {
  int64_t n = 0;
  for (int64_t i = 0; i < image_sizes.size(0); ++i)
    n += (image_sizes[i][0].item<int64_t>() / 8) * (image_sizes[i][1].item<int64_t>() / 8);
  return n;
}

TEST(PixtralCollator, PadsFourKeysTogetherAndKeepsImagesInOrder) {
  const auto config = data_config();
  conversation::ConversationDataset ds(options_of(config));
  conversation::VlmCollator collator(11);
  std::vector<Batch> samples = {ds.get(0), ds.get(1), ds.get(2)};
  std::vector<at::Generator> generators(3, at::make_generator<at::CPUGeneratorImpl>(0));
  auto batch = collator.collate(samples, generators);
  const auto& ids = batch.at("input_ids");
  ASSERT_EQ(ids.dim(), 2);
  for (const char* key : {"labels", "attention_mask", "position_ids"}) EXPECT_EQ(batch.at(key).sizes(), ids.sizes()) << key;
  int64_t images = 0;
  for (int64_t r = 0; r < 3; ++r) {
    const int64_t length = samples[r].at("input_ids").size(0);
    EXPECT_EQ(batch.at("attention_mask")[r].sum().item<int64_t>(), length);
    EXPECT_TRUE(batch.at("labels")[r].narrow(0, length, ids.size(1) - length).eq(-100).all().item<bool>());
    EXPECT_TRUE(batch.at("position_ids")[r].narrow(0, 0, length).equal(at::arange(length, at::kLong)));
    images += samples[r].count("image_sizes") ? samples[r].at("image_sizes").size(0) : 0;
  }
  ASSERT_TRUE(batch.count("pixel_values"));
  EXPECT_EQ(batch.at("pixel_values").size(0), images);
  EXPECT_EQ(ids.eq(kImg).sum().item<int64_t>(), expected_image_tokens(batch.at("image_sizes")));
}

TEST(PixtralCollator, PackedRowsRestartPositionsPerSample) {
  const auto config = data_config("      packing: true", 128);
  conversation::ConversationDataset ds(options_of(config));
  EXPECT_LT(ds.size(), 12);  // several samples per row
  EXPECT_CONTAINS(ds.summary(), "packed into");
  conversation::VlmCollator collator(11);
  std::vector<at::Generator> one(1, at::make_generator<at::CPUGeneratorImpl>(0)), two(2, one[0]);
  int64_t samples = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    auto batch = collator.collate({ds.get(i)}, one);
    const auto cu = batch.at("cu_seqlens");
    const int64_t length = batch.at("input_ids").size(1);
    EXPECT_LE(length, 128);
    EXPECT_EQ(cu[-1].item<int64_t>(), length);
    for (int64_t k = 0; k + 1 < cu.size(0); ++k) {
      const int64_t begin = cu[k].item<int64_t>(), end = cu[k + 1].item<int64_t>();
      EXPECT_TRUE(batch.at("position_ids")[0].narrow(0, begin, end - begin).equal(at::arange(end - begin, at::kLong)));
      EXPECT_TRUE(batch.at("attention_mask")[0].narrow(0, begin, end - begin).eq(k + 1).all().item<bool>());
      EXPECT_EQ(batch.at("input_ids")[0][begin].item<int64_t>(), kBos);
      EXPECT_EQ(batch.at("labels")[0][begin].item<int64_t>(), -100);
      ++samples;
    }
    if (batch.count("image_sizes"))
      EXPECT_EQ(batch.at("input_ids").eq(kImg).sum().item<int64_t>(), expected_image_tokens(batch.at("image_sizes")));
  }
  EXPECT_EQ(samples, 12);
  EXPECT_CONTAINS(error_of([&] { collator.collate({ds.get(0), ds.get(1)}, two); }), "micro_batch_size 1");
}

// A token budget's lengths come from the constructor's encoding (image headers, no decode): the
// same count as the sample get() builds, packed rows included.
TEST(ConversationDataset, SampleTokensAreTheBuiltSamplesLength) {
  for (const char* packing : {"", "      packing: true"}) {
    conversation::ConversationDataset ds(options_of(data_config(packing, 128)));
    for (int64_t i = 0; i < ds.size(); ++i)
      EXPECT_EQ(ds.sample_tokens(i), ds.get(i).at("input_ids").numel()) << "item " << i << packing;
  }
}

// A fixture of 4 samples whose sample 1 has an image with damaged pixel data: its header reads (the
// constructor keeps it), its IDAT chunk fails the CRC check at decode.
fs::path fixture_with_a_damaged_image() {
  const fs::path d = fs::temp_directory_path() / ("mmtrain_m3_damaged_" + std::to_string(::getpid()));
  mistral3::Mistral3DataFixture o;
  o.samples = 4;
  mistral3::fixture_mistral3_data(d.string(), o);
  const fs::path image = d / "images" / "img_1_0.png";
  std::ifstream in(image, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::string png(bytes.begin(), bytes.end());
  const size_t idat = png.find("IDAT");
  EXPECT_NE(idat, std::string::npos);
  bytes[idat + 5] ^= 0x01;
  std::ofstream(image, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return d;
}

Config damaged_data_config(const fs::path& dir, bool packing) {
  auto c = data_config(packing ? "      packing: true" : "", 256);
  c.data.dataset_param["basic_parameters"]["dataset"] = (dir / "conversations.json").string();
  c.data.dataset_param["preprocess_parameters"]["model_name_or_path"] = (dir / "tekken.json").string();
  return c;
}

TEST(ConversationDataset, AnImageThatFailsToDecodeIsACountedSkip) {
  const auto dir = fixture_with_a_damaged_image();
  conversation::ConversationDataset ds(options_of(damaged_data_config(dir, false)));
  ASSERT_EQ(ds.size(), 4);  // the header reads: kept
  EXPECT_GT(*ds.sample_tokens(1), 0);  // from its header: no decode, no warning yet
  ::testing::internal::CaptureStderr();
  const auto second = ds.get(1);
  const auto warning = ::testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(warning, "sample 1 skipped");
  EXPECT_CONTAINS(warning, "img_1_0.png");
  EXPECT_CONTAINS(warning, "CRC");
  EXPECT_CONTAINS(warning, "1 skipped so far");
  EXPECT_EQ(ds.skipped(), 1);
  // Item 1 is the next sample that decodes, sample 2, every time.
  EXPECT_TRUE(second.at("input_ids").equal(ds.get(2).at("input_ids")));
  EXPECT_TRUE(ds.get(1).at("pixel_values").equal(second.at("pixel_values")));
  EXPECT_EQ(ds.skipped(), 1);
  EXPECT_EQ(ds.sample_tokens(1), ds.sample_tokens(2));  // now its replacement's

  conversation::ConversationDataset packed(options_of(damaged_data_config(dir, true)));
  ::testing::internal::CaptureStderr();
  int64_t samples = 0;
  for (int64_t i = 0; i < packed.size(); ++i) samples += packed.get(i).at("cu_seqlens").size(0) - 1;
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(samples, 3);  // the row holding sample 1 lost it
  EXPECT_EQ(packed.skipped(), 1);
  fs::remove_all(dir);
}

TEST(ConversationDataset, MaxImagePixelsIsTheDecodeCap) {
  const auto options = options_of(data_config("", 256));
  EXPECT_EQ(options.max_image_pixels, image::kDefaultMaxImagePixels);
  auto c = data_config("", 256);
  c.data.dataset_param["preprocess_parameters"]["max_image_pixels"] = 400;  // the fixture's images are 8..40 px a side
  conversation::ConversationDataset capped(options_of(c));
  EXPECT_GT(capped.dropped().at("image file unreadable"), 1);  // the fixture's own unreadable one, and more
  EXPECT_LT(capped.size(), 12);
  EXPECT_CONTAINS(capped.summary(), "pixels, more than the limit of 400");
  c.data.dataset_param["preprocess_parameters"]["max_image_pixels"] = 0;
  EXPECT_CONTAINS(error_of([&] { options_of(c); }), "max_image_pixels: expected >= 1 pixel, found 0");
}

TEST(ConversationDataset, ConfigErrorsNameTheKey) {
  EXPECT_CONTAINS(error_of([] { options_of(data_config("      templte: mistral")); }),
                  "data.dataset_param.basic_parameters.templte: unknown key for dataset huggingface (did you mean 'template'?)");
  EXPECT_CONTAINS(error_of([] { options_of(data_config("      template: llama3")); }),
                  "data.dataset_param.basic_parameters.template: unknown chat template 'llama3'; known chat template "
                  "names: mistral");
  EXPECT_CONTAINS(error_of([] { options_of(data_config("      packing: yes please")); }),
                  "data.dataset_param.basic_parameters.packing: expected true or false");
  // The image processor's own keys come from the processor the model names (pixtral here).
  auto config = data_config();
  config.data.dataset_param["preprocess_parameters"]["image_longest_edg"] = 64;
  EXPECT_CONTAINS(error_of([&] { options_of(config); }),
                  "preprocess_parameters.image_longest_edg: unknown key for dataset huggingface (did you mean "
                  "'image_longest_edge'?)");
  // A model that takes no images cannot read conversations with images.
  config = data_config();
  config.model.model_id = "test_transformer";
  EXPECT_CONTAINS(error_of([&] { options_of(config); }),
                  "huggingface needs a vision-language model; model.model_id 'test_transformer' takes no images");
}

}  // namespace
}  // namespace mmtrain
