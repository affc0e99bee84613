// `magihuman` collator on a tiny config (Cv 16 = 4 latent channels x 1x2x2, Ca 8, Ct 24): batch
// keys, shapes and dtypes; coords against hand-computed rows; the video target reorder on a
// hand-made tensor; x_t / target identities against the documented draw order; packing of two
// samples (cu_seqlens); determinism given the generator seed.
#include "data/magihuman/collator.h"

#include "core/error.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace mmtrain::magihuman {
namespace {

constexpr int64_t kCv = 16, kCa = 8, kCt = 24;

PrecomputedDataOptions tiny_options() {
  PrecomputedDataOptions o;
  o.video_in_channels = kCv;
  o.audio_in_channels = kCa;
  o.text_in_channels = kCt;
  return o;
}

Batch make_sample(std::array<int64_t, 3> grid, int64_t na, int64_t nt, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t nv = grid[0] * grid[1] * grid[2];
  return {{"video_latent", at::randn({nv, kCv}, gen, at::kFloat)},
          {"video_grid_thw", at::tensor({grid[0], grid[1], grid[2]}, at::kLong)},
          {"audio_latent", at::randn({na, kCa}, gen, at::kFloat)},
          {"text_embed", at::randn({nt, kCt}, gen, at::kFloat)}};
}

// Sample b draws from a generator seeded seed + b.
Batch collate(const PrecomputedDataOptions& o, const std::vector<Batch>& samples, uint64_t seed) {
  std::vector<at::Generator> generators;
  for (size_t b = 0; b < samples.size(); ++b) generators.push_back(at::make_generator<at::CPUGeneratorImpl>(seed + b));
  return MagiHumanCollator(o).collate(samples, generators);
}

// Inverse of video_channels_last_within_patch: (pT,pH,pW,C) -> (C,pT,pH,pW).
at::Tensor unreorder(const at::Tensor& t) {
  const int64_t n = t.size(0), c = t.size(1) / 4;
  return t.reshape({n, 1, 2, 2, c}).permute({0, 4, 1, 2, 3}).reshape({n, 4 * c});
}

TEST(MagiHumanCollatorTest, ReorderOnHandMadeTensor) {
  // C = 2: input col c*4 + kh*2 + kw holds its own index; output col (kh*2 + kw)*2 + c.
  const auto tokens = at::arange(16, at::kFloat).view({2, 8});
  const auto out = video_channels_last_within_patch(tokens);
  const auto expected = at::tensor({0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15}, at::kFloat).view({2, 8});
  EXPECT_TRUE(at::equal(out, expected)) << out;
  // The full-size layout: out col (kh*2+kw)*48 + c = in col c*4 + kh*2 + kw.
  const auto big = video_channels_last_within_patch(at::arange(192, at::kFloat).view({1, 192}));
  for (int64_t c = 0; c < 48; ++c)
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(big[0][k * 48 + c].item<float>(), static_cast<float>(c * 4 + k));
  EXPECT_THROW(video_channels_last_within_patch(at::zeros({2, 6})), Error);
}

TEST(MagiHumanCollatorTest, CoordsHandComputed) {
  // Video grid (2,1,2); audio Na = 5 -> ref_T = (4 // 4 + 1) = 2; text Nt = 2 -> t in {-2, -1}.
  const auto coords = sample_coords({2, 1, 2}, 5, 2);
  const auto expected = at::tensor(
      {
          0, 0, 0, 2, 1, 2, 2, 1, 2,  //
          0, 0, 1, 2, 1, 2, 2, 1, 2,  //
          1, 0, 0, 2, 1, 2, 2, 1, 2,  //
          1, 0, 1, 2, 1, 2, 2, 1, 2,  // video: raw (t, h, w), no centring
          0, 0, 0, 5, 1, 1, 2, 1, 1,  //
          1, 0, 0, 5, 1, 1, 2, 1, 1,  //
          2, 0, 0, 5, 1, 1, 2, 1, 1,  //
          3, 0, 0, 5, 1, 1, 2, 1, 1,  //
          4, 0, 0, 5, 1, 1, 2, 1, 1,  // audio
          -2, 0, 0, 2, 1, 1, 1, 1, 1,  //
          -1, 0, 0, 2, 1, 1, 1, 1, 1,  // text: t offset -Nt, ref (1,1,1)
      },
      at::kFloat).view({11, 9});
  EXPECT_TRUE(at::equal(coords, expected)) << coords;
  // Audio reference length (Na - 1) / 4 + 1: Na = 101 -> ref_T 26; the 5 s sample: Na = 126 -> ref_T 32 = the video's T.
  EXPECT_EQ(sample_coords({1, 1, 1}, 101, 0)[1][6].item<float>(), 26.0f);
  EXPECT_EQ(sample_coords({1, 1, 1}, 126, 0)[1][6].item<float>(), 32.0f);
  EXPECT_EQ(sample_coords({1, 1, 1}, 1, 0)[1][6].item<float>(), 1.0f);
  // Row-major t, h, w for a 3-D grid: row 7 of (2,2,3) is t=1, h=0, w=1.
  const auto grid = get_coords({2, 2, 3}, {2, 2, 3}, {0, 0, 0});
  EXPECT_TRUE(at::equal(grid[7].narrow(0, 0, 3), at::tensor({1.0f, 0.0f, 1.0f})));
}

TEST(MagiHumanCollatorTest, KeysShapesDtypes) {
  const auto batch = collate(tiny_options(), {make_sample({2, 2, 3}, 5, 3, 1)}, 7);
  std::vector<std::string> keys;
  for (const auto& [k, _] : batch) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"coords_mapping", "cu_seqlens", "loss_mask", "max_seqlen",
                                            "modality_mapping", "target_velocity", "x"}));
  const int64_t l = 12 + 5 + 3;
  EXPECT_EQ(batch.at("x").sizes(), (std::vector<int64_t>{l, kCt}));  // io_width = max(16, 8, 24)
  EXPECT_EQ(batch.at("x").scalar_type(), at::kFloat);
  EXPECT_EQ(batch.at("coords_mapping").sizes(), (std::vector<int64_t>{l, 9}));
  EXPECT_EQ(batch.at("coords_mapping").scalar_type(), at::kFloat);
  EXPECT_EQ(batch.at("modality_mapping").sizes(), (std::vector<int64_t>{l}));
  EXPECT_EQ(batch.at("modality_mapping").scalar_type(), at::kLong);
  EXPECT_EQ(batch.at("target_velocity").sizes(), (std::vector<int64_t>{l, kCv}));  // out_width = max(16, 8)
  EXPECT_EQ(batch.at("target_velocity").scalar_type(), at::kFloat);
  EXPECT_EQ(batch.at("loss_mask").scalar_type(), at::kBool);
  EXPECT_EQ(batch.at("cu_seqlens").scalar_type(), at::kInt);
  EXPECT_TRUE(at::equal(batch.at("cu_seqlens"), at::tensor({0, static_cast<int>(l)}, at::kInt)));
  EXPECT_EQ(batch.at("max_seqlen").dim(), 0);
  EXPECT_EQ(batch.at("max_seqlen").scalar_type(), at::kInt);
  EXPECT_EQ(batch.at("max_seqlen").item<int>(), l);
}

// Replays the documented draw order (sigma, video noise, audio noise, from each sample's own
// generator) and checks
// every value of x and target_velocity exactly.
TEST(MagiHumanCollatorTest, NoisingMatchesDocumentedDrawOrder) {
  const auto o = tiny_options();
  const std::vector<Batch> samples = {make_sample({2, 2, 3}, 5, 3, 1), make_sample({1, 2, 2}, 2, 4, 2)};
  const auto batch = collate(o, samples, 11);
  int64_t row = 0;
  uint64_t seed = 11;
  for (const auto& s : samples) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed++);
    const auto& x0v = s.at("video_latent");
    const auto& x0a = s.at("audio_latent");
    const auto& text = s.at("text_embed");
    const int64_t nv = x0v.size(0), na = x0a.size(0), nt = text.size(0);
    const auto sigma = at::sigmoid(at::randn({1}, gen, at::kFloat) * 1.0 + 0.0);
    const auto eps_v = at::randn({nv, kCv}, gen, at::kFloat);
    const auto eps_a = at::randn({na, kCa}, gen, at::kFloat);
    const float sg = sigma.item<float>();
    EXPECT_GT(sg, 0.0f);
    EXPECT_LT(sg, 1.0f);
    const auto& x = batch.at("x");
    const auto& tgt = batch.at("target_velocity");
    EXPECT_TRUE(at::equal(x.narrow(0, row, nv).narrow(1, 0, kCv), (1 - sigma) * x0v + sigma * eps_v));
    EXPECT_TRUE(at::equal(x.narrow(0, row + nv, na).narrow(1, 0, kCa), (1 - sigma) * x0a + sigma * eps_a));
    EXPECT_TRUE(at::equal(x.narrow(0, row + nv + na, nt), text));  // text: clean, all Ct = io_width cols
    EXPECT_EQ(x.narrow(0, row, nv).narrow(1, kCv, kCt - kCv).abs().max().item<float>(), 0.0f);
    EXPECT_EQ(x.narrow(0, row + nv, na).narrow(1, kCa, kCt - kCa).abs().max().item<float>(), 0.0f);
    EXPECT_TRUE(at::equal(tgt.narrow(0, row, nv), video_channels_last_within_patch(eps_v - x0v)));
    EXPECT_TRUE(at::equal(tgt.narrow(0, row + nv, na).narrow(1, 0, kCa), eps_a - x0a));
    EXPECT_EQ(tgt.narrow(0, row + nv, na).narrow(1, kCa, kCv - kCa).abs().max().item<float>(), 0.0f);
    EXPECT_EQ(tgt.narrow(0, row + nv + na, nt).abs().max().item<float>(), 0.0f);
    // The identity the e2e test relies on: x_t - x0 = sigma * unreorder(target).
    EXPECT_TRUE(at::allclose(x.narrow(0, row, nv).narrow(1, 0, kCv) - x0v, sigma * unreorder(tgt.narrow(0, row, nv)),
                             1e-5, 1e-6));
    row += nv + na + nt;
  }
}

TEST(MagiHumanCollatorTest, TwoSamplesPack) {
  const auto batch = collate(tiny_options(), {make_sample({2, 2, 3}, 5, 3, 1), make_sample({1, 2, 2}, 2, 4, 2)}, 3);
  EXPECT_TRUE(at::equal(batch.at("cu_seqlens"), at::tensor({0, 20, 30}, at::kInt)));
  EXPECT_EQ(batch.at("max_seqlen").item<int>(), 20);
  std::vector<int64_t> modality;
  auto push = [&](int64_t value, int64_t n) { modality.insert(modality.end(), n, value); };
  for (auto [value, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 12}, {1, 5}, {2, 3}, {0, 4}, {1, 2}, {2, 4}})
    push(value, n);
  EXPECT_TRUE(at::equal(batch.at("modality_mapping"), at::tensor(modality, at::kLong)));
  EXPECT_TRUE(at::equal(batch.at("loss_mask"), at::tensor(modality, at::kLong) != 2));
  // Each sample has its own coords (sample 2 restarts at t = 0).
  EXPECT_TRUE(at::equal(batch.at("coords_mapping").narrow(0, 0, 20), sample_coords({2, 2, 3}, 5, 3)));
  EXPECT_TRUE(at::equal(batch.at("coords_mapping").narrow(0, 20, 10), sample_coords({1, 2, 2}, 2, 4)));
}

TEST(MagiHumanCollatorTest, DeterministicGivenGeneratorSeed) {
  const std::vector<Batch> samples = {make_sample({2, 2, 3}, 5, 3, 1)};
  const auto a = collate(tiny_options(), samples, 5), b = collate(tiny_options(), samples, 5),
             c = collate(tiny_options(), samples, 6);
  for (const auto& [key, t] : a) EXPECT_TRUE(at::equal(t, b.at(key))) << key;
  EXPECT_FALSE(at::equal(a.at("x"), c.at("x")));
}

TEST(MagiHumanCollatorTest, SigmaSamplingModes) {
  // scale 0: sigma = sigmoid(loc) exactly for every sample.
  auto o = tiny_options();
  o.logit_normal_scale = 0.0;
  o.logit_normal_loc = 0.0;
  const auto s = make_sample({1, 2, 2}, 3, 2, 4);
  const auto batch = collate(o, {s}, 1);
  const auto xv = batch.at("x").narrow(0, 0, 4).narrow(1, 0, kCv);
  const auto tv = batch.at("target_velocity").narrow(0, 0, 4);
  EXPECT_TRUE(at::allclose(xv - s.at("video_latent"), 0.5 * unreorder(tv), 1e-5, 1e-6));
  // uniform: sigma = one U[0,1) draw.
  o.sigma_sampling = SigmaSampling::kUniform;
  const auto u = collate(o, {s}, 9);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const auto sigma = at::rand({1}, gen, at::kFloat);
  const auto eps_v = at::randn({4, kCv}, gen, at::kFloat);
  EXPECT_TRUE(at::equal(u.at("x").narrow(0, 0, 4).narrow(1, 0, kCv), (1 - sigma) * s.at("video_latent") + sigma * eps_v));
}

TEST(MagiHumanCollatorTest, BadSamplesAreErrors) {
  const auto o = tiny_options();
  auto s = make_sample({1, 2, 2}, 3, 2, 4);
  s["audio_latent"] = at::zeros({3, kCa + 1});
  try {
    collate(o, {s}, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("audio_in_channels"), std::string::npos) << e.what();
  }
  EXPECT_THROW(collate(o, {}, 1), Error);
}

TEST(MagiHumanCollatorTest, OptionsFromDatasetParam) {
  const auto o = PrecomputedDataOptions::from_json_collate(
      {{"dataset_type", "magihuman_precomputed"}, {"sigma_sampling", "uniform"}, {"video_in_channels", 16}});
  EXPECT_EQ(o.sigma_sampling, SigmaSampling::kUniform);
  EXPECT_EQ(o.video_in_channels, 16);
  EXPECT_EQ(o.audio_in_channels, 64);
  EXPECT_EQ(o.io_width(), 3584);
  EXPECT_EQ(o.out_width(), 64);
  auto error_of = [](const nlohmann::json& j) {
    try {
      PrecomputedDataOptions::from_json_collate(j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({{"sigma_sampling", "gauss"}}).find("logit_normal|uniform"), std::string::npos);
  EXPECT_NE(error_of({{"sigma_samplng", "uniform"}}).find("did you mean 'sigma_sampling'"), std::string::npos);
  EXPECT_NE(error_of({{"video_in_channels", 18}}).find("data.dataset_param.video_in_channels"), std::string::npos);
  EXPECT_NE(error_of({{"logit_normal_scale", "x"}}).find("expected a number"), std::string::npos);
}

}  // namespace
}  // namespace mmtrain::magihuman
