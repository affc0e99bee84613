#include "data/image/image_processor.h"

namespace mmtrain::image {
namespace {

// Pixtral's processor: HF PixtralImageProcessor's resize and normalisation, and its [IMG] grid.
class PixtralProcessor : public ImageProcessor {
 public:
  explicit PixtralProcessor(PixtralImageConfig config) : config_(config) { config_.validate(); }
  ImageSize resize_size(int64_t height, int64_t width) const override {
    return pixtral_resize_size(height, width, config_);
  }
  at::Tensor preprocess(const at::Tensor& rgb) const override { return pixtral_preprocess(rgb, config_); }
  ImageTokenLayout token_layout(const ImageSize& size) const override {
    return image_token_layout(size.height, size.width, config_);
  }
  std::array<std::string, 3> token_names() const override { return {"[IMG]", "[IMG_BREAK]", "[IMG_END]"}; }

 private:
  PixtralImageConfig config_;
};

const StaticRegistration<ImageProcessorFactory> pixtral(
    image_processor_registry(), "pixtral", {{"image_longest_edge", "align_to_merged_patch"},
                [](const VisionInputs& vision, const ParamMap& preprocess) -> std::shared_ptr<const ImageProcessor> {
                  PixtralImageConfig c;
                  c.patch_size = vision.patch_size;
                  c.spatial_merge_size = vision.spatial_merge_size;
                  c.longest_edge = preprocess.get_int("image_longest_edge", vision.image_size);
                  c.align_to_merged_patch = preprocess.get_bool("align_to_merged_patch", true);
                  return std::make_shared<PixtralProcessor>(c);
                }});

}  // namespace

Registry<ImageProcessorFactory>& image_processor_registry() {
  static Registry<ImageProcessorFactory> registry("image processor");
  return registry;
}

}  // namespace mmtrain::image
