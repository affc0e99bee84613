// stb_image decoding into RGB uint8 [H, W, 3]; see image_decode.h. Links Debian's libstb.so
// (its implementation is compiled there, so no STB_IMAGE_IMPLEMENTATION here).
#include "data/image/image_decode.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "io/user_file.h"

#include <stb/stb_image.h>

#include <array>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

namespace mmtrain::image {
namespace {

// CRC-32 (IEEE 802.3, zlib's), which every PNG chunk carries over its type and data.
uint32_t png_crc(const uint8_t* data, size_t size) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ data[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t big_endian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// stb_image ignores PNG checksums; Pillow refuses a chunk whose CRC does not match. So do we:
// a damaged file is an error naming the chunk, not an image with wrong pixels.
constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

void check_png_chunks(const uint8_t* data, size_t size, const std::string& label) {
  if (size < 8 || std::memcmp(data, kPngSignature, 8) != 0) return;  // not a PNG
  size_t at = 8;
  while (at + 12 <= size) {
    const uint32_t length = big_endian32(data + at);
    if (length > size - at - 12) return;  // truncated: stb's decode says so
    const uint8_t* type = data + at + 4;
    const uint32_t stored = big_endian32(type + 4 + length);
    if (png_crc(type, 4 + length) != stored)
      fail("image ", label, ": PNG chunk '", std::string(reinterpret_cast<const char*>(type), 4), "' at byte ", at,
           " fails its CRC check (the file is damaged)");
    if (std::memcmp(type, "IEND", 4) == 0) return;
    at += 12 + length;
  }
}

// An image above the cap (by default PIL's decompression-bomb bound) is refused from its header,
// before gigabytes are decoded.
void check_pixel_count(int64_t width, int64_t height, int64_t max_pixels, const std::string& label);

// stb_image refuses a PNG whose header claims more than 2^24 pixels a side or overflows its size
// arithmetic, and then reports the last format it tried ("unknown image type"). The first 24
// bytes (signature, IHDR width and height) say what the file claims: checked against the cap,
// such a header is named for what it is.
void check_png_header_pixels(const uint8_t* data, size_t size, int64_t max_pixels, const std::string& label) {
  if (size < 24 || std::memcmp(data, kPngSignature, 8) != 0 || std::memcmp(data + 12, "IHDR", 4) != 0) return;
  check_pixel_count(big_endian32(data + 16), big_endian32(data + 20), max_pixels, label);
}

void check_pixel_count(int64_t width, int64_t height, int64_t max_pixels, const std::string& label) {
  if (width * height > max_pixels)
    fail("image ", label, ": ", width, "x", height, " = ", width * height, " pixels, more than the limit of ",
         max_pixels, max_pixels == kDefaultMaxImagePixels ? " (PIL's decompression-bomb bound)" : "",
         "; refused before decoding (the limit is preprocess_parameters.max_image_pixels)");
}


}  // namespace

at::Tensor composite_on_white(const at::Tensor& rgba) {
  if (rgba.dim() != 3 || rgba.size(2) != 4 || rgba.scalar_type() != at::kByte)
    fail("composite_on_white: expected uint8 [H, W, 4], found ", rgba.scalar_type(), " ", rgba.sizes());
  const auto src = rgba.contiguous();
  const int64_t pixels = src.size(0) * src.size(1);
  auto out = at::empty({src.size(0), src.size(1), 3}, at::kByte);
  const uint8_t* in = src.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  // Pillow AlphaComposite.c with dst = (255, 255, 255, 255), PRECISION_BITS 7: the output alpha
  // is 255, coef1 = a*255*255*128 / (255*255) = a*128, coef2 = (255-a)*128, and each channel is
  // ((t >> 8) + t) >> 8 >> 7 of t = src*coef1 + 255*coef2 + (0x80 << 7): a rounded division by 255.
  constexpr uint32_t kBits = 7;
  for (int64_t i = 0; i < pixels; ++i, in += 4, o += 3) {
    const uint32_t a = in[3];
    if (a == 0) {  // Pillow copies dst for a fully transparent source pixel
      o[0] = o[1] = o[2] = 255;
      continue;
    }
    const uint32_t out_a255 = a * 255 + 255 * (255 - a);
    const uint32_t coef1 = a * 255 * 255 * (1u << kBits) / out_a255;
    const uint32_t coef2 = 255 * (1u << kBits) - coef1;
    for (int c = 0; c < 3; ++c) {
      const uint32_t t = in[c] * coef1 + 255u * coef2 + (0x80u << kBits);
      o[c] = static_cast<uint8_t>((((t >> 8) + t) >> 8) >> kBits);
    }
  }
  return out;
}

at::Tensor decode_image_bytes(const uint8_t* data, size_t size, const std::string& label, int64_t max_pixels) {
  if (size == 0) fail("image ", label, ": empty (0 bytes), expected an encoded image (PNG, JPEG, ...)");
  if (size > static_cast<size_t>(INT32_MAX)) fail("image ", label, ": ", size, " bytes, stb_image reads at most 2 GiB");
  int width = 0, height = 0, channels = 0;
  if (stbi_info_from_memory(data, static_cast<int>(size), &width, &height, &channels))
    check_pixel_count(width, height, max_pixels, label);
  else
    check_png_header_pixels(data, size, max_pixels, label);
  check_png_chunks(data, size, label);
  // Ask for 4 channels always; `channels` still reports the source's (2 and 4 = transparency,
  // which includes a PNG tRNS chunk).
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(data, static_cast<int>(size), &width, &height, &channels, 4), stbi_image_free);
  if (!pixels) {
    const char* reason = stbi_failure_reason();
    fail("image ", label, ": cannot decode (", reason ? reason : "unknown reason",
         "); expected a PNG, JPEG, BMP, GIF, TGA, PSD or PNM image");
  }
  if (width <= 0 || height <= 0) fail("image ", label, ": decoded to ", height, "x", width, " pixels, expected at least 1x1");
  auto rgba = at::empty({height, width, 4}, at::kByte);
  std::memcpy(rgba.data_ptr<uint8_t>(), pixels.get(), static_cast<size_t>(height) * width * 4);
  if (channels == 2 || channels == 4) return composite_on_white(rgba);
  return rgba.narrow(2, 0, 3).contiguous();
}

at::Tensor decode_image_file(const std::string& path, int64_t max_pixels) {
  require_regular_file(path, "image " + path, "an image file");  // its messages name what was expected
  const std::string bytes = read_user_file(path, "image " + path, kMaxImageFileBytes);
  return decode_image_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path, max_pixels);
}

ImageDims read_image_dims(const std::string& path, int64_t max_pixels) {
  require_regular_file(path, "image " + path, "an image file");
  int width = 0, height = 0, channels = 0;
  if (!stbi_info(path.c_str(), &width, &height, &channels)) {
    const char* reason = stbi_failure_reason();
    uint8_t header[24] = {};
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(header), sizeof header);
    check_png_header_pixels(header, static_cast<size_t>(in.gcount()), max_pixels, path);
    fail("image ", path, ": cannot read the header (", reason ? reason : "unknown reason",
         "); expected a PNG, JPEG, BMP, GIF, TGA, PSD or PNM image");
  }
  if (width <= 0 || height <= 0) fail("image ", path, ": header gives ", height, "x", width, " pixels, expected at least 1x1");
  check_pixel_count(width, height, max_pixels, path);
  return {height, width};
}

}  // namespace mmtrain::image
