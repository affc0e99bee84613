// Pillow's `Image.resize(..., BICUBIC)` for 8-bit RGB, reimplemented so the C++ pipeline produces
// the same bytes as HF's PIL-backed image processors (PixtralImageProcessorPil resizes a uint8
// image through PIL; the torchvision-backed processor's uint8 antialiased bicubic is a port of
// the same algorithm). Algorithm (Pillow src/libImaging/Resample.c, ImagingResampleInner):
//   - separable convolution with the Keys cubic, a = -0.5, support 2; when downscaling the kernel
//     is stretched by the scale (antialiasing), pixel centres at (i + 0.5) * in/out;
//   - weights normalised per output pixel, then rounded to 22-bit fixed point;
//   - two passes, each rounded and clipped to uint8: horizontal first (over only the source rows
//     the vertical pass reads), except that Pillow 13 runs the vertical pass first when the height
//     shrinks by more than twice as many pixels as the width (in_h - out_h > 2 * (in_w - out_w));
//     Pillow <= 12 always went horizontal first. The intermediate rounding makes the order
//     visible (up to ~25 levels on noise), so the order must match the Pillow the reference uses;
//   - a pass whose size does not change is skipped (same size in and out: a copy).
// Bit-exact with Pillow 13.0 (400 random size pairs; tests/parity/test_image_pipeline.py checks
// the whole Pixtral pipeline); with always_horizontal_first, Pillow 9-12's algorithm.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace mmtrain::image {

enum class PillowPassOrder {
  pillow13,                 // Pillow >= 13: vertical first when the height shrinks much more
  always_horizontal_first,  // Pillow <= 12
};

// rgb: uint8 [H, W, C] (any C >= 1, channels resampled independently) -> uint8 [out_h, out_w, C].
at::Tensor resize_bicubic_pil(const at::Tensor& rgb, int64_t out_height, int64_t out_width,
                              PillowPassOrder order = PillowPassOrder::pillow13);

}  // namespace mmtrain::image
