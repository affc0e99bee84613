// Image decoding for the vision pipelines: PNG / JPEG / BMP / GIF (first frame) / TGA / PSD /
// PNM bytes -> RGB uint8 [H, W, 3] (stb_image, Debian libstb). Colour conversion follows HF's
// `convert_to_rgb` (image_transforms.py), which every HF image processor applies first:
//   - grey -> R = G = B;
//   - any transparency (an alpha channel, or a PNG tRNS chunk) is composited onto opaque white
//     with Pillow's integer `alpha_composite` arithmetic, so a PNG decodes to the very bytes
//     `np.array(convert_to_rgb(PIL.Image.open(path)))` gives;
//   - 16-bit PNG channels keep their high byte (as Pillow does for RGB/RGBA; Pillow clips 16-bit
//     greyscale instead, which is not reproduced).
// JPEG decoding is stb's (integer IDCT, its own chroma upsampling), not libjpeg-turbo's: pixels
// may differ from Pillow's by a few levels (docs/image_pipeline.md). EXIF orientation is not
// applied (neither does an HF processor given a PIL image).
// Refused, naming the path: a PNG chunk whose CRC fails (stb alone ignores CRCs; Pillow does not),
// more than max_pixels pixels (from the header, before decoding), a path that is not a
// regular file. Every error names the path (or the label given for in-memory bytes).
#pragma once
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace mmtrain::image {

// The default pixel cap: PIL's DecompressionBombError bound (2 x Image.MAX_IMAGE_PIXELS). The
// Magistral dataset takes another from preprocess_parameters.max_image_pixels.
constexpr int64_t kDefaultMaxImagePixels = 178956970;

// Reads and decodes `path`. Fails when the file is missing, unreadable, empty, not a decodable
// image or larger than max_pixels, naming the path and the reason.
at::Tensor decode_image_file(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels);

// Decodes `size` bytes of an encoded image; `label` names the source in errors.
at::Tensor decode_image_bytes(const uint8_t* data, size_t size, const std::string& label,
                              int64_t max_pixels = kDefaultMaxImagePixels);

struct ImageDims {
  int64_t height = 0;
  int64_t width = 0;
};

// The pixel size from the file's header alone (no decode). Fails like decode_image_file for a
// missing file or an unrecognised/corrupt header; a file whose pixel data is damaged passes here
// and fails at decode.
ImageDims read_image_dims(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels);

// RGBA uint8 [H, W, 4] -> RGB uint8 [H, W, 3] over opaque white, bit-exact with Pillow's
// Image.alpha_composite(white, rgba).convert("RGB").
at::Tensor composite_on_white(const at::Tensor& rgba);

}  // namespace mmtrain::image
