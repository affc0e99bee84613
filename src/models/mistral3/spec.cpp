// The Mistral3 (Magistral-Small-2509) spec: what the tools and the trainer know of model_id
// "mistral3".
#include "core/error.h"
#include "core/json_read.h"
#include "core/text.h"
#include "io/atomic_file.h"
#include "models/mistral3/flops.h"
#include "models/mistral3/hf_adapter.h"
#include "models/mistral3/model.h"
#include "models/decoder_activations.h"
#include "models/model_spec.h"

#include <cmath>
#include <filesystem>
#include <sstream>

namespace mmtrain::mistral3 {
namespace {

// An HF model directory describes itself in config.json (read as model.config).
nlohmann::json config_from_checkpoint(const std::string& hf_dir) {
  const auto path = std::filesystem::path(hf_dir) / "config.json";
  if (!std::filesystem::exists(path))
    fail("mistral3 checkpoint ", hf_dir, ": no config.json; give --config with the model's model.config");
  return json_parse_checked(file_read_text(path.string()), "mistral3 checkpoint: " + path.string());
}

FlopsReport flops(const nlohmann::json& model_config, const FlopsQuery& q) {
  const auto c = Mistral3Config::from_json(model_config);
  if (q.attention_coefficient)
    fail("flops mistral3: --attention-coefficient is not used: mistral3 counts causal attention exactly");
  int64_t patches = 0, merged = 0;
  std::ostringstream image_list;
  for (size_t i = 0; i < q.images.size(); ++i) {
    const auto [h, w] = q.images[i];
    if (h < c.patch_size || w < c.patch_size || h > c.image_size || w > c.image_size)
      fail("flops mistral3: image ", h, "x", w, ": height and width must be in [patch_size ", c.patch_size,
           ", vision image_size ", c.image_size, "]");
    const int64_t gh = h / c.patch_size, gw = w / c.patch_size;
    const int64_t image_tokens = (gh / c.spatial_merge_size) * (gw / c.spatial_merge_size);
    patches += gh * gw;
    merged += image_tokens;
    image_list << (i ? ", " : "") << h << "x" << w << " (" << gh * gw << " patches -> " << image_tokens << " [IMG])";
  }
  const auto f = mistral3_flops_terms(c, q.seqlens, q.images);
  int64_t tokens = 0;
  for (int64_t s : q.seqlens) tokens += s;
  const double text = f.text_matmul + f.text_attention;
  const double vision = f.vision_multiplier * (f.vision_forward + f.projector_forward);
  auto commas = [](double v) { return with_commas(std::llround(v)); };

  FlopsReport r;
  r.title = "Mistral3 FLOPs (causal text attention, vision x1 when frozen; docs/flops.md)";
  r.lines = {
      format("text model             %lld layers, hidden %lld, %lld q / %lld kv heads x %lld, vocab %lld",
             static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
             static_cast<long long>(c.num_heads), static_cast<long long>(c.num_kv_heads),
             static_cast<long long>(c.head_dim), static_cast<long long>(c.vocab_size)),
      format("vision model           %lld layers, hidden %lld, patch %lld, merge %lld, %s",
             static_cast<long long>(c.vision_num_layers), static_cast<long long>(c.vision_hidden_size),
             static_cast<long long>(c.patch_size), static_cast<long long>(c.spatial_merge_size),
             c.freeze_vision ? "frozen: forward only, x1" : "trained: forward + backward, x3"),
      format("matmul params          text %s (layers + lm_head), vision %s, projector %s",
             commas(f.text_matmul_params).c_str(), commas(f.vision_matmul_params).c_str(),
             commas(f.projector_matmul_params).c_str()),
      format("samples                %zu, seqlens [%s], %lld tokens", q.seqlens.size(), join_ints(q.seqlens).c_str(),
             static_cast<long long>(tokens)),
      format("text term              %.4e FLOPs = %.2f GFLOP per token (matmuls %.2f + causal attention %.2f)", text,
             text / tokens / 1e9, f.text_matmul / tokens / 1e9, f.text_attention / tokens / 1e9),
  };
  if (!q.images.empty()) {
    if (q.images.size() > 1) image_list << "; " << patches << " patches -> " << merged << " [IMG] in all";
    r.lines.push_back(format("images                 %zu: %s", q.images.size(), image_list.str().c_str()));
    r.lines.push_back(format("vision term            %.4e FLOPs: tower forward %.4e + projector forward %.4e, x%g (%s)",
                             vision, f.vision_forward, f.projector_forward, f.vision_multiplier,
                             c.freeze_vision ? "frozen" : "trained"));
  }
  r.fields = {{"text_matmul_params", static_cast<int64_t>(std::llround(f.text_matmul_params))},
              {"vision_matmul_params", static_cast<int64_t>(std::llround(f.vision_matmul_params))},
              {"projector_matmul_params", static_cast<int64_t>(std::llround(f.projector_matmul_params))},
              {"samples", static_cast<int64_t>(q.seqlens.size())},
              {"tokens", tokens},
              {"text_matmul_flops", f.text_matmul},
              {"text_attention_flops", f.text_attention},
              {"text_flops_per_token", text / tokens},
              {"images", static_cast<int64_t>(q.images.size())},
              {"patches", patches},
              {"merged_tokens", merged},
              {"vision_forward_flops", f.vision_forward},
              {"projector_forward_flops", f.projector_forward},
              {"vision_multiplier", f.vision_multiplier},
              {"vision_flops", vision}};
  r.flops_per_sample = f.total() / static_cast<double>(q.seqlens.size());
  r.attention_flops_per_sample = f.text_attention / static_cast<double>(q.seqlens.size());  // the tower's stays in GEMM
  return r;
}

// The text model is a dense decoder (models/decoder_activations.h), its loss chunked as
// loss_chunk_size says; image tokens are part of its sequence. With freeze_vision the tower and
// the projector run on inputs that need no grad: autograd keeps nothing of them. Trained, the
// Pixtral tower is a dense encoder of the same layer structure (RMSNorm, attention, SwiGLU MLP;
// no head) over the micro-batch's patches P = Σ (H / patch) (W / patch), kept whole (the seed's
// recompute plan wraps the language layers), and the projector keeps its norm's input, normalized
// and output (3 P vh e), the merging linear's input (P vh e), and per merged token (P / m^2)
// linear_1's input (vh e), GELU's input and linear_2's (th e each): all outside the text layers;
// backward's transients are the tower's or the text's, the larger.
ActivationEstimate activations(const ActivationQuery& q) {
  const auto c = Mistral3Config::from_json(q.model_config);
  DecoderShape d;
  d.hidden = c.hidden_size;
  d.heads = c.num_heads;
  d.kv_heads = c.num_kv_heads;
  d.head_dim = c.head_dim;
  d.ffn = c.intermediate_size;
  d.layers = c.num_layers;
  d.vocab = c.vocab_size;
  d.loss_chunk = c.loss_chunk_size;
  ActivationEstimate a = decoder_activation_estimate(d, q.seqlen, q.micro_batch_size, q.param_dtype);
  if (c.freeze_vision || q.images.empty()) return a;
  int64_t patches = 0;
  for (const auto& [h, w] : q.images) patches += (h / c.patch_size) * (w / c.patch_size);
  DecoderShape v;
  v.hidden = c.vision_hidden_size;
  v.heads = v.kv_heads = c.vision_num_heads;
  v.head_dim = c.vision_head_dim();
  v.ffn = c.vision_intermediate_size;
  v.layers = c.vision_num_layers;
  const ActivationEstimate tower = decoder_activation_estimate(v, patches, q.micro_batch_size, q.param_dtype);
  const int64_t p = tower.tokens, e = static_cast<int64_t>(c10::elementSize(q.param_dtype));
  const int64_t merged = p / (c.spatial_merge_size * c.spatial_merge_size);
  const int64_t projector = 4 * p * v.hidden * e + merged * (v.hidden + 2 * c.hidden_size) * e;
  a.outside_bytes += tower.layers_full_bytes + tower.outside_bytes + projector;
  a.backward_bytes = std::max(a.backward_bytes, tower.backward_bytes);
  return a;
}

ModelSpec mistral3_spec() {
  ModelSpec spec;
  spec.name = "mistral3";
  spec.title = "Mistral3 (Magistral-Small-2509)";
  spec.execution_only_keys = {"loss_chunk_size"};
  // torchtune / LLaMA-Factory: every projection of the text decoder. The Pixtral tower's
  // attention is also called q_proj, so the patterns name the tower; adapting it is opt-in (and
  // needs freeze_vision: false). The LM head is computed inside the chunked loss: not adaptable.
  const std::string text = "model.language_model.layers.{*}.", vision = "model.vision_tower.transformer.layers.{*}.";
  for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                        "mlp.up_proj", "mlp.down_proj"})
    spec.lora_default_targets.push_back(text + p);
  spec.lora_supported_targets = {text + "self_attn.?_proj", text + "mlp.*_proj", vision + "attention.?_proj",
                                 vision + "feed_forward.*_proj", "model.multi_modal_projector.linear_?",
                                 "model.multi_modal_projector.patch_merger.merging_layer"};
  spec.peft_task_type = "CAUSAL_LM";
  spec.dpo_form = "log_probs";
  spec.hf_config = [](const nlohmann::json& model_config) { return Mistral3Config::from_json(model_config).to_hf_json(); };
  spec.converter_alias = "Mistral3Converter";
  spec.build = [](const nlohmann::json& j) { return make_mistral3(Mistral3Config::from_json(j)); };
  spec.hf_adapter = [](const nlohmann::json&) { return std::make_shared<Mistral3HfAdapter>(); };
  spec.config_from_checkpoint = config_from_checkpoint;
  spec.flops = flops;
  spec.activations = activations;
  spec.vision_inputs = [](const nlohmann::json& j) {
    const auto c = Mistral3Config::from_json(j);
    return VisionInputs{"pixtral", c.patch_size, c.spatial_merge_size, c.image_size};
  };
  return spec;
}

const ModelSpecRegistration registration(mistral3_spec());

}  // namespace
}  // namespace mmtrain::mistral3
