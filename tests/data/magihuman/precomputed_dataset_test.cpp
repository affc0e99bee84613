// `magihuman_precomputed` dataset: reads .pt (torch.save zip, written here by pickle_save) and
// .safetensors samples, accepts the alternative key names, a list grid and [1, Nt, C] text,
// sorts by stem, honours max_samples, reads lazily, and every error names the offending path.
#include "data/magihuman/precomputed_dataset.h"

#include "checkpoint/checkpoint_test_util.h"
#include "core/error.h"
#include "io/safetensors.h"

#include "test_util.h"

#include <gtest/gtest.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>
#include <fstream>
#include <limits>

namespace mmtrain::magihuman {
namespace {

namespace fs = std::filesystem;
using mmtrain::testing::TempDir;

constexpr int64_t kCv = 16, kCa = 8, kCt = 24;

struct Fixture {
  TempDir dir;
  fs::path root() const { return fs::path(dir.str()); }
  fs::path file(const char* sub, const std::string& stem, const std::string& ext = ".pt") const {
    fs::create_directories(root() / sub);
    return root() / sub / (stem + ext);
  }
  // One sample: video grid (1, 2, 3), Na 4, Nt 5; values offset by `tag` so samples differ.
  void write(const std::string& stem, float tag, const std::string& ext = ".pt") const {
    auto put = [&](const fs::path& path, std::vector<std::pair<std::string, at::Tensor>> t) {
      if (ext == ".pt")
        write_pt_file(path.string(), t);
      else
        safetensors_write(path.string(), t);
    };
    put(file("latents", stem, ext), {{"video_latent", at::full({6, kCv}, tag)}, {"video_grid_thw", at::tensor({1, 2, 3}, at::kLong)}});
    put(file("audio_latents", stem, ext), {{"audio_latent", at::full({4, kCa}, tag)}});
    put(file("conditions", stem, ext), {{"prompt_embeds", at::full({5, kCt}, tag)}});
  }
  nlohmann::json param(nlohmann::json extra = nlohmann::json::object()) const {
    nlohmann::json p = {{"dataset_type", "magihuman_precomputed"}, {"data_root", root().string()},
                        {"video_in_channels", kCv}, {"audio_in_channels", kCa}, {"text_in_channels", kCt}};
    for (auto it = extra.begin(); it != extra.end(); ++it) p[it.key()] = it.value();
    return p;
  }
  PrecomputedDataset open(nlohmann::json extra = nlohmann::json::object()) const {
    return PrecomputedDataset(PrecomputedDataOptions::from_json(param(std::move(extra))));
  }
};

using mmtrain::testing::error_of;

TEST(MagiHumanDatasetTest, ReadsPtAndSafetensorsSortedByStem) {
  Fixture f;
  f.write("b", 2.0f);
  f.write("a", 1.0f, ".safetensors");
  f.write("c", 3.0f);
  const auto ds = f.open();
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.stem(0), "a");
  EXPECT_EQ(ds.stem(2), "c");
  for (int64_t i = 0; i < 3; ++i) {
    const auto s = ds.get(i);
    const float tag = static_cast<float>(i + 1);
    EXPECT_TRUE(at::equal(s.at("video_latent"), at::full({6, kCv}, tag)));
    EXPECT_TRUE(at::equal(s.at("video_grid_thw"), at::tensor({1, 2, 3}, at::kLong)));
    EXPECT_TRUE(at::equal(s.at("audio_latent"), at::full({4, kCa}, tag)));
    EXPECT_TRUE(at::equal(s.at("text_embed"), at::full({5, kCt}, tag)));
  }
  EXPECT_EQ(f.open({{"max_samples", 2}}).size(), 2);
  EXPECT_EQ(f.open({{"max_samples", 0}}).size(), 3);
  // The packed sequence a sample becomes: 6 video + 4 audio + 5 text rows.
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(ds.sample_tokens(i), 15);
}

// Issue 47: header row counts are claims. A [2^62, 0] tensor holds no bytes, so three of them
// summed wrapped to a negative length; the sum is checked and the sample named.
TEST(MagiHumanDatasetTest, HeaderRowCountsThatOverflowNameTheSample) {
  Fixture f;
  auto write_header = [](const fs::path& path, const std::string& key, const std::string& extra = "") {
    const std::string header = "{\"" + key + "\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,0],"
                               "\"data_offsets\":[0,0]}" + extra + "}";
    const uint64_t length = header.size();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header;
  };
  write_header(f.file("latents", "s", ".safetensors"), "video_latent");
  write_header(f.file("audio_latents", "s", ".safetensors"), "audio_latent");
  write_header(f.file("conditions", "s", ".safetensors"), "prompt_embeds");
  const auto ds = f.open();
  const std::string message = error_of([&] { ds.sample_tokens(0); });
  EXPECT_CONTAINS(message, f.file("latents", "s", ".safetensors").string());
}

TEST(MagiHumanDatasetTest, AlternativeKeysListGridAndLeadingOne) {
  Fixture f;
  // grid as a Python-style tuple, video under `latents`, text [1, Nt, C] bf16 under `text_embed`.
  c10::impl::GenericDict latents(c10::StringType::get(), c10::AnyType::get());
  latents.insert("latents", at::ones({6, kCv}));
  latents.insert("grid_thw", c10::ivalue::Tuple::create({int64_t{3}, int64_t{1}, int64_t{2}}));
  latents.insert("note", std::string("not a tensor"));
  const auto bytes = torch::jit::pickle_save(latents);
  std::ofstream(f.file("latents", "s"), std::ios::binary).write(bytes.data(), bytes.size());
  write_pt_file(f.file("audio_latents", "s").string(), {{"latents", at::ones({4, kCa}, at::kDouble)}});
  write_pt_file(f.file("conditions", "s").string(), {{"text_embed", at::ones({1, 5, kCt}, at::kBFloat16)}});
  const auto s = f.open().get(0);
  EXPECT_TRUE(at::equal(s.at("video_grid_thw"), at::tensor({3, 1, 2}, at::kLong)));
  EXPECT_EQ(s.at("audio_latent").scalar_type(), at::kFloat);
  EXPECT_EQ(s.at("text_embed").sizes(), (std::vector<int64_t>{5, kCt}));
  EXPECT_EQ(s.at("text_embed").scalar_type(), at::kFloat);
}

TEST(MagiHumanDatasetTest, DirectoryErrorsNameThePath) {
  Fixture f;
  const auto missing = (f.root() / "nowhere").string();
  auto e = error_of([&] { f.open({{"data_root", missing}}); });
  EXPECT_CONTAINS(e, missing);
  EXPECT_CONTAINS(e, "data.dataset_param.data_root");
  EXPECT_CONTAINS(error_of([&] { PrecomputedDataOptions::from_json({{"dataset_type", "magihuman_precomputed"}}); }),
                  "data.dataset_param.data_root: required");

  f.write("a", 1.0f);
  fs::remove_all(f.root() / "conditions");
  e = error_of([&] { f.open(); });
  EXPECT_CONTAINS(e, (f.root() / "conditions").string());
  EXPECT_CONTAINS(e, "missing subdirectory");
}

TEST(MagiHumanDatasetTest, SampleMissingAModalityNamesStemAndDirectory) {
  Fixture f;
  f.write("a", 1.0f);
  f.write("b", 2.0f);
  fs::remove(f.file("audio_latents", "b"));
  auto e = error_of([&] { f.open(); });
  EXPECT_CONTAINS(e, (f.root() / "audio_latents").string());
  EXPECT_CONTAINS(e, "'b'");
  EXPECT_CONTAINS(e, f.file("latents", "b").string());
  // A stem only in conditions/ is a sample without latents.
  f.write("b", 2.0f);
  write_pt_file(f.file("conditions", "z").string(), {{"prompt_embeds", at::ones({5, kCt})}});
  e = error_of([&] { f.open(); });
  EXPECT_CONTAINS(e, (f.root() / "latents").string());
  EXPECT_CONTAINS(e, "'z'");
  // Two files with one stem in one directory.
  fs::remove(f.file("conditions", "z"));
  safetensors_write(f.file("latents", "a", ".safetensors").string(), {{"video_latent", at::ones({6, kCv})}});
  EXPECT_CONTAINS(error_of([&] { f.open(); }), "two for stem 'a'");
}

TEST(MagiHumanDatasetTest, ContentErrorsNameTheFileAndAreLazy) {
  Fixture f;
  f.write("a", 1.0f);
  const auto latents = f.file("latents", "a").string();
  // Missing key: lists what was found.
  write_pt_file(latents, {{"video", at::ones({6, kCv})}, {"video_grid_thw", at::tensor({1, 2, 3})}});
  auto ds = f.open();  // opening reads nothing
  auto e = error_of([&] { ds.get(0); });
  EXPECT_CONTAINS(e, latents);
  EXPECT_CONTAINS(e, "'video_latent' (or 'latents')");
  EXPECT_CONTAINS(e, "found keys: video, video_grid_thw");
  // T * H * W != Nv.
  write_pt_file(latents, {{"video_latent", at::ones({7, kCv})}, {"video_grid_thw", at::tensor({1, 2, 3})}});
  e = error_of([&] { ds.get(0); });
  EXPECT_CONTAINS(e, latents);
  EXPECT_CONTAINS(e, "gives 6 tokens, but the video latent has 7 rows");
  // Wrong width names the dataset_param key.
  write_pt_file(latents, {{"video_latent", at::ones({6, kCv + 4})}, {"video_grid_thw", at::tensor({1, 2, 3})}});
  e = error_of([&] { ds.get(0); });
  EXPECT_CONTAINS(e, latents);
  EXPECT_CONTAINS(e, "data.dataset_param.video_in_channels");
  f.write("a", 1.0f);
  const auto cond = f.file("conditions", "a").string();
  write_pt_file(cond, {{"prompt_embeds", at::ones({5, kCt - 1})}});
  e = error_of([&] { ds.get(0); });
  EXPECT_CONTAINS(e, cond);
  EXPECT_CONTAINS(e, "text_in_channels");
  // Not a torch.save file.
  std::ofstream(cond, std::ios::binary | std::ios::trunc) << "garbage";
  e = error_of([&] { ds.get(0); });
  EXPECT_CONTAINS(e, cond);
  EXPECT_CONTAINS(e, "torch.save");
  // A safetensors sample with a bad header names its file too.
  fs::remove(cond);
  const auto cond_st = f.file("conditions", "a", ".safetensors").string();
  std::ofstream(cond_st, std::ios::binary) << "12345678";
  EXPECT_CONTAINS(error_of([&] { f.open().get(0); }), cond_st);
}

// Values and shapes that would only fail later, far from their file: NaN/Inf, a grid whose
// product overflows, a non-regular file where a sample should be.
TEST(MagiHumanDatasetTest, NonFiniteValuesOverflowingGridsAndNonRegularFilesNameTheFile) {
  Fixture f;
  f.write("a", 1.0f);
  const auto audio = f.file("audio_latents", "a").string();
  auto bad = at::ones({4, kCa});
  bad[2][3] = std::numeric_limits<float>::quiet_NaN();
  write_pt_file(audio, {{"audio_latent", bad}});
  auto ds = f.open();
  auto e = error_of([&] { ds.get(0); });
  EXPECT_CONTAINS(e, audio);
  EXPECT_CONTAINS(e, "NaN or Inf values (first in row 2 of 4)");
  bad[2][3] = std::numeric_limits<float>::infinity();
  write_pt_file(audio, {{"audio_latent", bad}});
  EXPECT_CONTAINS(error_of([&] { ds.get(0); }), "NaN or Inf");

  f.write("a", 1.0f);
  const auto latents = f.file("latents", "a").string();
  // 2^22 x 2^22 x 2^22 wraps to 0 in 64 bits.
  const int64_t big = int64_t{1} << 22;
  write_pt_file(latents, {{"video_latent", at::ones({6, kCv})}, {"video_grid_thw", at::tensor({big, big, big})}});
  e = error_of([&] { ds.get(0); });
  EXPECT_CONTAINS(e, latents);
  EXPECT_CONTAINS(e, "overflows");

  f.write("a", 1.0f);
  fs::create_directories(f.root() / "conditions" / "b.pt");  // a directory where a sample file should be
  e = error_of([&] { f.open(); });
  EXPECT_CONTAINS(e, (f.root() / "conditions" / "b.pt").string());
  EXPECT_CONTAINS(e, "not a regular file");
}

// A .pt sample whose pickle nests 300k lists crashed LibTorch's unpickler; it is refused first.
TEST(MagiHumanDatasetTest, ADeeplyNestedPickleIsRefusedBeforeUnpickling) {
  Fixture f;
  f.write("a", 1.0f);
  const auto latents = f.file("latents", "a").string();
  std::string pickle = std::string("\x80\x02}\x8c\x0c") + "video_latent";
  pickle += std::string(300000, ']') + std::string(299999, 'a') + "s.";
  {
    std::ofstream out(latents, std::ios::binary | std::ios::trunc);
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
      return n;
    });
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    writer.writeEndOfFile();
  }
  const auto e = error_of([&] { f.open().get(0); });
  EXPECT_CONTAINS(e, latents);
  EXPECT_CONTAINS(e, "more than 10000 lists, dicts and tuples");
}

TEST(MagiHumanDatasetTest, RegisteredNames) {
  EXPECT_TRUE(dataset_registry().contains("magihuman_precomputed"));
  EXPECT_TRUE(collator_registry().contains("magihuman"));
  Fixture f;
  f.write("a", 1.0f);
  DataConfig data;
  data.dataset_param = f.param({{"basic_parameters", {{"dataset_dir", f.root().string()}, {"max_samples", 1}}}});
  data.dataset_param.erase("data_root");
  EXPECT_EQ(dataset_registry().get("magihuman_precomputed")(data, ModelConfig{})->size(), 1);
}

}  // namespace
}  // namespace mmtrain::magihuman
