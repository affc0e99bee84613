// LoRA (Hu et al. 2021), the features.lora section: each Linear that target_modules select gets
// a low-rank adapter, y = W x + scale * B (A x) with A [r, in] and B [out, r], scale = alpha / r
// (alpha / sqrt(r) with use_rslora); B starts at zero, so the adapted model starts as the base.
// Everything else is frozen (Param::requires_grad = false) except the modules_to_save, which
// train in full. A Linear that stacks modality experts (MagiHuman) gets one adapter pair per
// expert, stacked the same way (nn/layers.h).
//
// Names follow HF peft: "<module>.lora_A.weight", "<module>.lora_B.weight"; rank is peft's `r`,
// alpha `lora_alpha`, init "kaiming" its default and "gaussian" its init_lora_weights="gaussian".
#pragma once
#include "nn/module.h"
#include "quant/base_quant.h"

#include <string>
#include <vector>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct LoraConfig {
  int64_t rank = 8;                           // peft r, torchtune lora_rank
  double alpha = 16.0;                        // peft lora_alpha, torchtune lora_alpha
  double dropout = 0.0;                       // peft lora_dropout (only 0 is implemented)
  std::vector<std::string> target_modules;    // module patterns; empty: the model's default list
  bool use_rslora = false;                    // scale alpha / sqrt(r) instead of alpha / r
  std::string init = "kaiming";               // A's init: kaiming (uniform +-1/sqrt(in)) | gaussian (normal, std 1/r)
  std::vector<std::string> modules_to_save;   // module patterns trained in full beside the adapters
  at::ScalarType adapter_dtype = at::kFloat;  // what the adapters are gathered and computed in
  // The frozen base's storage (QLoRA; docs/qlora.md): none | nf4 | int8 | fp8_e4m3. Quantized are
  // the frozen weights of the Linears the model can adapt whose rows hold whole blocks
  // (quant/quantized_rows.h); the adapters and modules_to_save keep their dtypes.
  std::string base_quant = "none";

  double scale() const;
  static void declare(ConfigSection<LoraConfig>& section);
};

// What apply_lora did, for the run's first record and the plan.
struct LoraSummary {
  std::vector<std::string> adapted;   // the Linear modules that got an adapter
  int64_t adapter_params = 0;         // elements of every lora_A / lora_B
  int64_t trainable_params = 0;       // adapters plus modules_to_save
};

// Adds the adapters to model and freezes what does not train. default_targets: the model's
// list (ModelSpec::lora_default_targets) used when config.target_modules is empty. Fails, naming
// the key, when a pattern matches no module, a target is not a Linear or not one its model
// adapts, a target is too small for the rank, or a module is both a target and a module to save.
// supported: the patterns of the Linears whose model applies an adapter (ModelSpec::
// lora_supported_targets); a target outside them is refused.
LoraSummary apply_lora(Module& model, const LoraConfig& config, const std::vector<std::string>& default_targets,
                       const std::vector<std::string>& supported);

// Marks the frozen weight of every Linear matching `supported` (ModelSpec::lora_supported_targets)
// whose rows hold whole blocks of `kind` to be stored quantized (quant/quantized_rows.h; FSDP
// shards the codes and scales and dequantizes on gather). QLoRA's base and a full fine-tuning
// preference run's reference copy (training.dpo.reference_quant). Returns how many; none for none.
int64_t quantize_frozen_linears(Module& model, quant::BaseQuant kind, const std::vector<std::string>& supported);

// While one lives, on this thread, every LoRA adapter is off: the model computes its base (and
// the modules_to_save as they are now). A preference objective's reference forward (train/objective.h):
// the base without a second copy, as peft's disable_adapter().
class LoraAdaptersOff {
 public:
  LoraAdaptersOff();
  ~LoraAdaptersOff();
  LoraAdaptersOff(const LoraAdaptersOff&) = delete;
  LoraAdaptersOff& operator=(const LoraAdaptersOff&) = delete;

 private:
  bool was_on_;
};
// False while a LoraAdaptersOff lives on this thread.
bool lora_adapters_on();

// A model's trained element count (Param::requires_grad, trainable), LoRA or not, and its count
// of parameter elements, frozen ones included (buffers are not parameters).
int64_t trainable_param_count(Module& model);
int64_t total_param_count(Module& model);

}  // namespace mmtrain
