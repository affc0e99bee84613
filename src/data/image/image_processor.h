// How a vision-language model's images become pixels and image tokens, chosen by name (the model
// spec's VisionInputs::image_processor) from a registry, so that a conversation dataset serves any
// VLM without knowing its config. One processor per vision tower family: "pixtral" (Magistral,
// Mistral-Small-3.x: data/image/pixtral_image.h).
#pragma once
#include "core/param_map.h"
#include "core/registry.h"
#include "data/image/pixtral_image.h"
#include "models/model_spec.h"

#include <ATen/ATen.h>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain::image {

class ImageProcessor {
 public:
  virtual ~ImageProcessor() = default;
  // The (height, width) an image of height x width pixels is resized to; fails for a size that
  // resizes to nothing.
  virtual ImageSize resize_size(int64_t height, int64_t width) const = 0;
  // rgb uint8 [H, W, 3] -> float32 [3, H', W'] at resize_size(H, W).
  virtual at::Tensor preprocess(const at::Tensor& rgb) const = 0;
  // The image-token grid of an image already resized to `size`.
  virtual ImageTokenLayout token_layout(const ImageSize& size) const = 0;
  // The tokenizer's names of the image, row-break and end tokens ("[IMG]", "[IMG_BREAK]", "[IMG_END]").
  virtual std::array<std::string, 3> token_names() const = 0;
};

struct ImageProcessorFactory {
  // The keys of data.dataset_param.preprocess_parameters this processor reads.
  std::vector<std::string> preprocess_keys;
  std::function<std::shared_ptr<const ImageProcessor>(const VisionInputs& vision, const ParamMap& preprocess)> make;
};

// Processors register from their own file: const StaticRegistration<ImageProcessorFactory>
// reg(image_processor_registry(), "pixtral", factory);
Registry<ImageProcessorFactory>& image_processor_registry();

}  // namespace mmtrain::image
