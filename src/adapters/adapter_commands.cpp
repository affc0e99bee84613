// `mmtrain convert MODEL lora-to-peft | peft-to-ckpt | merge-lora | quantize-base | dequantize-base`:
// a LoRA run's adapters out to (and in from) HF peft, merged into full weights, and the quantized
// bases QLoRA trains over.
#include "adapters/lora_convert.h"
#include "adapters/quantize_base.h"
#include "cli/command.h"
#include "convert/convert.h"
#include "core/dtype.h"
#include "models/model_spec.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <memory>

namespace mmtrain {

void add_adapter_commands(CLI::App& app, Commands& commands) {
  for (const auto& name : model_spec_registry().names()) {
    struct Options {
      std::string peft_dir, save_dir, load_dir, config_path, base_model, base_dir;
      int world_size = 0;
      std::string dtype = "public";
      std::string quant_dtype = "nf4", public_dtype = "bf16";
      bool overwrite = false;
      bool ema = false;
    };
    auto o = std::make_shared<Options>();
    auto* model_cmd = convert_command_of(app, name);
    auto* to_peft = model_cmd->add_subcommand("lora-to-peft", "a LoRA run's checkpoint -> HF peft adapter directory");
    to_peft->add_option("--load_dir", o->load_dir, "checkpoint iter_N directory or save root of a LoRA run")->required();
    to_peft->add_option("--save_dir", o->save_dir, "adapter directory to write")->required();
    to_peft->add_option("--base_model", o->base_model,
                        "adapter_config.json's base_model_name_or_path (default: --base, else the run's model weights path)");
    const std::string base_help = "the base weights where they are now, if moved since training (checked against the "
                                  "fingerprint the adapters were trained over)";
    to_peft->add_option("--base", o->base_dir, base_help);
    auto* from_peft = model_cmd->add_subcommand("peft-to-ckpt", "HF peft adapter directory -> LoRA checkpoint to continue from");
    from_peft->add_option("--peft_dir", o->peft_dir, "adapter directory (adapter_model.safetensors + adapter_config.json)")
        ->required();
    from_peft->add_option("--config", o->config_path, "YAML of the LoRA run that will continue from it (its base and "
                                                       "features.lora)")->required();
    from_peft->add_option("--save_dir", o->save_dir, "checkpoint root to write (iter_0000000 + latest)")->required();
    from_peft->add_option("--world-size,--world_size", o->world_size, "ranks of that run (for its global batch)")
        ->capture_default_str();
    auto* merge = model_cmd->add_subcommand("merge-lora", "a LoRA run's checkpoint -> merged full weights (public layout)");
    merge->add_option("--load_dir", o->load_dir, "checkpoint iter_N directory or save root of a LoRA run")->required();
    merge->add_option("--save_dir", o->save_dir, "directory to write model.safetensors (and the base's other files) into")
        ->required();
    merge->add_option("--dtype", o->dtype, "public: each tensor in the model's public checkpoint dtype; fp32: unrounded")
        ->check(CLI::IsMember({"public", "fp32"}))
        ->capture_default_str();
    merge->add_option("--base", o->base_dir, base_help);
    auto* quantize = model_cmd->add_subcommand("quantize-base", "HF directory -> the same with its LoRA-adaptable Linear "
                                                                "weights quantized (nf4: bitsandbytes' layout)");
    quantize->add_option("--load_dir", o->load_dir, "HF directory (its config.json and safetensors)")->required();
    quantize->add_option("--save_dir", o->save_dir, "HF directory to write")->required();
    quantize->add_option("--dtype", o->quant_dtype, "nf4 (bitsandbytes, blocks of 64, double-quantized), int8 "
                                                    "(bitsandbytes LLM.int8 rows) or fp8_e4m3 (per-row scale)")
        ->check(CLI::IsMember({"nf4", "int8", "fp8_e4m3"}))
        ->capture_default_str();
    auto* dequantize = model_cmd->add_subcommand("dequantize-base", "a quantize-base (or -bnb-4bit) directory -> its "
                                                                    "weights dequantized");
    dequantize->add_option("--load_dir", o->load_dir, "quantized HF directory")->required();
    dequantize->add_option("--save_dir", o->save_dir, "HF directory to write")->required();
    dequantize->add_option("--dtype", o->public_dtype, "the 8-bit formats' output dtype (nf4 records its own)")
        ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
        ->capture_default_str();
    for (auto* sub : {to_peft, from_peft, merge, quantize, dequantize})
      sub->add_flag("--overwrite", o->overwrite, kOverwriteHelp);
    for (auto* sub : {to_peft, merge})
      sub->add_flag("--ema", o->ema, "the adapters' EMA (training.ema) in place of their trained values");
    commands.add(from_peft, [o, name] {
      convert_peft_to_ckpt(name, o->config_path, o->peft_dir, o->save_dir, std::max(1, o->world_size), o->overwrite);
    });
    commands.add(to_peft, [o, name] {
      convert_lora_to_peft(name, o->load_dir, o->save_dir, o->base_model, o->base_dir, o->overwrite, o->ema);
    });
    commands.add(merge, [o, name] {
      convert_merge_lora(name, o->load_dir, o->save_dir, o->dtype, o->base_dir, o->overwrite, o->ema);
    });
    commands.add(quantize, [o, name] {
      convert_quantize_base(name, o->load_dir, o->save_dir, quant::parse_base_quant(o->quant_dtype, "--dtype"), o->overwrite);
    });
    commands.add(dequantize, [o, name] {
      convert_dequantize_base(name, o->load_dir, o->save_dir, *dtype_parse(o->public_dtype), o->overwrite);
    });
  }
}

}  // namespace mmtrain
