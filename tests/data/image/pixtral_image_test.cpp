// The Pixtral image pipeline (src/data/image/): the HF resize-size rule (floor into longest_edge,
// then up to a multiple of 28, or 14 with align_to_merged_patch off), the [IMG]/[IMG_BREAK]/
// [IMG_END] expansion, Pillow-exact bicubic and normalisation on small cases whose expected bytes
// were produced by Pillow 13 / numpy (the full comparison against HF is
// tests/parity/test_image_pipeline.py), decoding incl. alpha over white, and every error naming
// its cause (missing file, corrupt or empty bytes, zero-size images, too few pixels for a token).
#include "data/image/image_decode.h"
#include "data/image/pil_resize.h"
#include "data/image/pixtral_image.h"

#include "checkpoint/checkpoint_test_util.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <fstream>

namespace mmtrain::image {
namespace {

using mmtrain::testing::TempDir;

std::vector<uint8_t> bytes_of(const at::Tensor& t) {
  const auto c = t.contiguous();
  return {c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel()};
}

at::Tensor image_from(const std::vector<int>& values, int64_t h, int64_t w) {
  std::vector<uint8_t> v(values.begin(), values.end());
  return at::tensor(v, at::kByte).view({h, w, 3}).clone();
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// 2x2 RGBA PNG (Pillow): (255,0,0,255) (0,255,0,128) / (0,0,255,0) (10,20,30,64).
const std::vector<uint8_t> kRgbaPng = {
    137, 80,  78,  71,  13,  10,  26,  10,  0,   0,   0,   13,  73,  72,  68,  82, 0,   0,   0,   2,   0,
    0,   0,   2,   8,   6,   0,   0,   0,   114, 182, 13,  36,  0,   0,   0,   26, 73,  68,  65,  84,  120,
    156, 99,  248, 207, 192, 240, 159, 225, 63,  67,  3,   3,   3,   195, 127, 6,  46,  17,  57,  7,   0,
    54,  193, 4,   249, 208, 191, 140, 44,  0,   0,   0,   0,   73,  69,  78,  68, 174, 66,  96,  130};
// 1x3 greyscale PNG: 0, 200, 7.
const std::vector<uint8_t> kGrayPng = {137, 80,  78, 71,  13, 10,  26,  10,  0,   0,  0,   13,  73, 72,
                                       68,  82,  0,  0,   0,  3,   0,   0,   0,   1,  8,   0,   0,  0,
                                       0,   62,  139, 75, 104, 0,   0,   0,   12,  73, 68,  65,  84, 120,
                                       156, 99,  96, 56,  193, 14,  0,   1,   155, 0,  208, 20,  37, 19,
                                       102, 0,   0,  0,   0,  73,  69,  78,  68,  174, 66,  96,  130};

TEST(PixtralImage, ResizeSizeFollowsHfRule) {
  PixtralImageConfig c;  // official processor: multiples of 28
  auto check = [&](int64_t h, int64_t w, int64_t eh, int64_t ew) {
    const auto s = pixtral_resize_size(h, w, c);
    EXPECT_EQ(s.height, eh) << h << "x" << w;
    EXPECT_EQ(s.width, ew) << h << "x" << w;
  };
  check(1, 1, 28, 28);          // tiny images are stretched up to one merged patch
  check(3, 17, 28, 28);
  check(480, 640, 504, 644);    // a COCO example: 18x23 tokens
  check(4000, 3000, 1540, 1176);  // floor(3000 / (4000/1540)) = 1155 -> 1176
  check(3000, 4000, 1176, 1540);
  check(1540, 1540, 1540, 1540);
  check(1541, 1541, 1540, 1540);
  check(1568, 20, 1540, 28);
  check(28, 56, 28, 56);        // exact multiples stay
  check(29, 57, 56, 84);
  c.align_to_merged_patch = false;  // LLaMA-Factory / MindSpeed-MM: multiples of 14
  check(1, 1, 14, 14);
  check(3, 17, 14, 28);
  check(480, 640, 490, 644);
  check(4000, 3000, 1540, 1162);
  check(29, 57, 42, 70);
}

TEST(PixtralImage, TokenLayoutCountsAfterMerge) {
  PixtralImageConfig c;
  auto l = image_token_layout(504, 644, c);
  EXPECT_EQ(l.rows, 18);
  EXPECT_EQ(l.cols, 23);
  EXPECT_EQ(l.image_tokens(), 414);
  EXPECT_EQ(l.total_tokens(), 432);
  l = image_token_layout(1540, 1540, c);
  EXPECT_EQ(l.rows, 55);
  EXPECT_EQ(l.total_tokens(), 3080);
  l = image_token_layout(490, 644, c);  // a 14-aligned image: the odd patch row is dropped
  EXPECT_EQ(l.rows, 17);
  EXPECT_EQ(l.cols, 23);
}

TEST(PixtralImage, TokenIdsExpansion) {
  ImageTokenLayout l{2, 3};
  EXPECT_EQ(l.token_ids(10, 12, 13), (std::vector<int64_t>{10, 10, 10, 12, 10, 10, 10, 13}));
  l = {1, 1};
  EXPECT_EQ(l.token_ids(10, 12, 13), (std::vector<int64_t>{10, 13}));
  l = {3, 1};
  EXPECT_EQ(l.token_ids(kImageTokenId, kImageBreakTokenId, kImageEndTokenId),
            (std::vector<int64_t>{10, 12, 10, 12, 10, 13}));
  const auto ids = ImageTokenLayout{18, 23}.token_ids(10, 12, 13);
  EXPECT_EQ(static_cast<int64_t>(ids.size()), 432);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 10), 414);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 12), 17);
  EXPECT_EQ(ids.back(), 13);
}

TEST(PixtralImage, ZeroSizeAndTooSmallFail) {
  PixtralImageConfig c;
  EXPECT_THROW_WITH(pixtral_resize_size(0, 5, c), "0x5", "at least 1x1");
  EXPECT_THROW_WITH(pixtral_resize_size(5, -1, c), "5x-1");
  EXPECT_THROW_WITH(pixtral_resize_size(2000, 1, c), "1540x0", "aspect ratio");
  EXPECT_THROW_WITH(image_token_layout(0, 28, c), "0x28");
  EXPECT_THROW_WITH(image_token_layout(14, 28, c), "14x28", "no image tokens");
  EXPECT_THROW_WITH((ImageTokenLayout{0, 3}.token_ids(10, 12, 13)), "0 rows");
  EXPECT_THROW_WITH(resize_bicubic_pil(at::zeros({0, 4, 3}, at::kByte), 28, 28), "empty image");
  EXPECT_THROW_WITH(resize_bicubic_pil(at::zeros({4, 4, 3}, at::kByte), 0, 28), "0x28");
  EXPECT_THROW_WITH(pixtral_preprocess(at::zeros({0, 0, 3}, at::kByte), c), "0x0");
  EXPECT_THROW_WITH(pixtral_preprocess(at::zeros({4, 4, 3}, at::kFloat), c), "uint8 [H, W, 3]");
  c.patch_size = 0;
  EXPECT_THROW_WITH(pixtral_resize_size(5, 5, c), "patch_size");
}

TEST(PixtralImage, BicubicMatchesPillowBytes) {
  // Expected bytes: np.array(Image.fromarray(src).resize((W, H), Image.BICUBIC)) with Pillow 13.
  std::vector<int> src(5 * 3 * 3);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int>(i * 17 % 256);
  const auto up = resize_bicubic_pil(image_from(src, 5, 3), 4, 7);  // Pillow 13: vertical pass first here
  const std::vector<int> up_expected = {
      29,  46,  63,  38,  56,  73,  59,  80,  97,  85,  102, 119, 111, 101, 118, 132, 93,  110, 141, 91,  108,
      104, 120, 137, 113, 133, 150, 133, 171, 188, 160, 192, 209, 192, 146, 163, 220, 89,  106, 232, 67,  84,
      136, 169, 186, 147, 147, 164, 177, 90,  107, 192, 44,  61,  145, 65,  82,  89,  103, 120, 67,  116, 133,
      122, 145, 162, 132, 143, 160, 156, 135, 152, 178, 134, 151, 177, 156, 173, 169, 180, 197, 167, 190, 207};
  EXPECT_EQ(bytes_of(up), std::vector<uint8_t>(up_expected.begin(), up_expected.end()));

  std::vector<int> src2(9 * 11 * 3);
  for (size_t i = 0; i < src2.size(); ++i) src2[i] = static_cast<int>(i * 37 % 256);
  const auto down = resize_bicubic_pil(image_from(src2, 9, 11), 3, 4);  // antialiased downscale
  const std::vector<int> down_expected = {131, 123, 119, 126, 133, 129, 119, 131, 134, 120, 111, 136,
                                          133, 136, 110, 121, 138, 127, 121, 118, 140, 140, 126, 121,
                                          110, 145, 133, 128, 117, 133, 139, 123, 125, 125, 116, 118};
  EXPECT_EQ(bytes_of(down), std::vector<uint8_t>(down_expected.begin(), down_expected.end()));

  // Pillow <= 12 pass order (horizontal first) on the same vertical-first case: expected bytes from
  // a Python port of the algorithm (that port matches Pillow 13 on 400 random size pairs), not
  // from an old Pillow.
  const auto legacy = resize_bicubic_pil(image_from(src, 5, 3), 4, 7, PillowPassOrder::always_horizontal_first);
  const std::vector<int> legacy_expected = {
      33,  46,  63,  38,  56,  73,  59,  80,  97,  85,  102, 119, 111, 101, 118, 132, 93,  110, 140, 92,  108,
      104, 120, 137, 113, 133, 150, 133, 170, 187, 160, 192, 209, 193, 146, 163, 221, 90,  107, 229, 69,  84,
      136, 169, 185, 147, 146, 163, 177, 90,  107, 192, 44,  61,  145, 66,  83,  89,  103, 120, 67,  116, 133,
      122, 145, 162, 132, 143, 160, 156, 135, 152, 178, 134, 151, 177, 156, 173, 170, 180, 197, 167, 190, 207};
  EXPECT_EQ(bytes_of(legacy), std::vector<uint8_t>(legacy_expected.begin(), legacy_expected.end()));

  const auto same = image_from(src, 5, 3);
  EXPECT_TRUE(at::equal(resize_bicubic_pil(same, 5, 3), same));
  const auto flat = at::full({7, 9, 3}, 77, at::kByte);
  EXPECT_TRUE(at::equal(resize_bicubic_pil(flat, 28, 56), at::full({28, 56, 3}, 77, at::kByte)));
}

TEST(PixtralImage, NormalizeMatchesNumpyFloat32) {
  // numpy: (float32(v * (1/255)) - float32(mean)) / float32(std), all float32.
  const auto px = pixtral_normalize(image_from({0, 0, 0, 128, 128, 128, 255, 255, 255}, 1, 3), PixtralImageConfig{});
  ASSERT_EQ(px.sizes(), (at::IntArrayRef{3, 1, 3}));
  const float expected[3][3] = {{-1.7922625541687012f, 0.07633614540100098f, 1.9303361177444458f},
                                {-1.7520971298217773f, 0.16889731585979462f, 2.0748836994171143f},
                                {-1.480219841003418f, 0.33994877338409424f, 2.1458969116210938f}};
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(px[c][0][i].item<float>(), expected[c][i]) << c << "," << i;
}

TEST(PixtralImage, PreprocessShape) {
  const auto px = pixtral_preprocess(at::full({480, 640, 3}, 255, at::kByte), PixtralImageConfig{});
  EXPECT_EQ(px.sizes(), (at::IntArrayRef{3, 504, 644}));
  EXPECT_EQ(px.scalar_type(), at::kFloat);
  EXPECT_FLOAT_EQ(px[1][503][643].item<float>(), 2.0748836994171143f);
}

TEST(ImageDecode, PngWithAlphaCompositesOnWhite) {
  const auto rgb = decode_image_bytes(kRgbaPng.data(), kRgbaPng.size(), "rgba.png");
  ASSERT_EQ(rgb.sizes(), (at::IntArrayRef{2, 2, 3}));
  // np.array(transformers convert_to_rgb(PIL.Image.open(...))) of the same bytes.
  EXPECT_EQ(bytes_of(rgb), (std::vector<uint8_t>{255, 0, 0, 127, 255, 127, 255, 255, 255, 194, 196, 199}));
  const auto gray = decode_image_bytes(kGrayPng.data(), kGrayPng.size(), "gray.png");
  ASSERT_EQ(gray.sizes(), (at::IntArrayRef{1, 3, 3}));
  EXPECT_EQ(bytes_of(gray), (std::vector<uint8_t>{0, 0, 0, 200, 200, 200, 7, 7, 7}));
}

TEST(ImageDecode, FileErrorsNameThePath) {
  TempDir dir;
  const auto missing = dir / "nope.png";
  EXPECT_THROW_WITH(decode_image_file(missing), missing, "no such file");
  EXPECT_THROW_WITH(decode_image_file(dir.str()), dir.str(), "directory");

  const auto garbage = dir / "garbage.jpg";
  write_file(garbage, {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  EXPECT_THROW_WITH(decode_image_file(garbage), garbage, "cannot decode");

  const auto truncated = dir / "truncated.png";
  write_file(truncated, std::vector<uint8_t>(kRgbaPng.begin(), kRgbaPng.begin() + 40));
  EXPECT_THROW_WITH(decode_image_file(truncated), truncated, "cannot decode");

  const auto empty = dir / "empty.png";
  write_file(empty, {});
  EXPECT_THROW_WITH(decode_image_file(empty), empty, "empty");

  const auto good = dir / "ok.png";
  write_file(good, kGrayPng);
  EXPECT_EQ(decode_image_file(good).sizes(), (at::IntArrayRef{1, 3, 3}));

  // One flipped bit in the pixel data: stb alone would decode it; the chunk's CRC refuses it.
  auto damaged = kGrayPng;
  const size_t idat = std::search(damaged.begin(), damaged.end(), "IDAT", "IDAT" + 4) - damaged.begin();
  ASSERT_LT(idat + 4, damaged.size());
  damaged[idat + 5] ^= 0x01;
  const auto crc = dir / "crc.png";
  write_file(crc, damaged);
  EXPECT_THROW_WITH(decode_image_file(crc), crc, "'IDAT'", "CRC");

  EXPECT_THROW_WITH(decode_image_file("/dev/zero"), "/dev/zero", "not a regular file");
  EXPECT_THROW_WITH(decode_image_file(std::string(good) + std::string("\0x.png", 6)), good, "NUL byte");
  EXPECT_THROW_WITH(read_image_dims("/dev/zero"), "/dev/zero", "not a regular file");
}

// A PNG whose header claims 20000 x 20000 pixels (400 Mpx) is refused from the header alone.
TEST(ImageDecode, PixelBombsAreRefusedBeforeDecoding) {
  auto bomb = kGrayPng;  // IHDR: width at bytes 16..19, height at 20..23, then its CRC at 29..32
  const uint8_t side[4] = {0x00, 0x00, 0x4e, 0x20};  // 20000
  std::copy(side, side + 4, bomb.begin() + 16);
  std::copy(side, side + 4, bomb.begin() + 20);
  TempDir dir;
  const auto path = dir / "bomb.png";
  write_file(path, bomb);
  EXPECT_THROW_WITH(read_image_dims(path), path, "400000000 pixels", "decompression-bomb");
  EXPECT_THROW_WITH(decode_image_file(path), path, "400000000 pixels");
  // A cap of one's own: the 3x1 image passes at 3 pixels and is refused at 2.
  const auto small = dir / "small.png";
  write_file(small, kGrayPng);
  EXPECT_EQ(read_image_dims(small, 3).width, 3);
  EXPECT_EQ(decode_image_file(small, 3).size(1), 3);
  EXPECT_THROW_WITH(read_image_dims(small, 2), small, "3 pixels, more than the limit of 2", "max_image_pixels");
  EXPECT_THROW_WITH(decode_image_file(small, 2), small, "more than the limit of 2");

  // Headers stb_image itself refuses (past 2^24 a side, or its size arithmetic overflowing) are
  // over the cap too, not an "unknown image type".
  const std::pair<std::array<uint8_t, 4>, std::array<uint8_t, 4>> huge[] = {
      {{0x00, 0x01, 0x86, 0xa0}, {0x00, 0x01, 0x86, 0xa0}},  // 100000 x 100000
      {{0x80, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x00, 0x01}},  // 2^31 x 1
  };
  for (const auto& [w, h] : huge) {
    auto header = kGrayPng;
    std::copy(w.begin(), w.end(), header.begin() + 16);
    std::copy(h.begin(), h.end(), header.begin() + 20);
    const auto claims = dir / "claims.png";
    write_file(claims, header);
    EXPECT_THROW_WITH(read_image_dims(claims), claims, "pixels, more than the limit of");
    EXPECT_THROW_WITH(decode_image_file(claims), claims, "pixels, more than the limit of");
  }
}

}  // namespace
}  // namespace mmtrain::image
