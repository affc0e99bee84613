"""The two models at the bench size that bench/validation.py, bench/lora.py and bench/token_budget.sh
share: MagiHuman with 3 layers of width 384 on a `fixture magihuman --mix` set (samples of ~200-2600 tokens), Magistral
with a 4-layer width-384 decoder and a 2-layer Pixtral tower on `fixture mistral3 --mix` (0-4 images
per sample); FSDP over the transformer layers, seed 5, AdamW at a constant 1e-4, clip 1.0."""
from pathlib import Path

MODELS = {
    "magihuman": """parallel: {fsdp_plan: {apply_modules: ["dit.block.layers.{*}"]}}
model:
  model_id: magihuman
  config: {num_layers: 3, hidden_size: 384, head_dim: 64, num_query_groups: 2, video_in_channels: 64,
           audio_in_channels: 32, text_in_channels: 64, mm_layers: [0, 2], gelu7_layers: [0]}
""",
    "mistral3": """parallel:
  fsdp_plan: {apply_modules: ["model.vision_tower.transformer.layers.{*}", "model.language_model.layers.{*}"]}
model:
  model_id: mistral3
  config:
    image_token_index: 10
    spatial_merge_size: 2
    text_config: {vocab_size: 288, hidden_size: 384, num_hidden_layers: 4, num_attention_heads: 6,
                  num_key_value_heads: 2, head_dim: 64, intermediate_size: 1024, rope_theta: 10000.0}
    vision_config: {hidden_size: 128, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 256,
                    patch_size: 4, image_size: 40, hidden_act: silu}
""",
}


def dataset(model: str, data: Path) -> str:
    """The dataset_param (or validation) mapping of the fixture set at DATA, as one flow line."""
    if model == "magihuman":
        return f"{{dataset_type: magihuman_precomputed, data_root: {data}}}"
    return (f"{{dataset_type: huggingface, preprocess_parameters: {{model_name_or_path: {data}/tekken.json}}, "
            f"basic_parameters: {{template: mistral, dataset: {data}/conversations.json, cutoff_len: 1024}}}}")


def config(model: str, data: Path, out: Path, steps: int, global_batch: int, training="", features="",
           validation=False) -> str:
    """One run's YAML: TRAINING is appended to the training mapping (", save: ..."), FEATURES is a
    features mapping's body, VALIDATION holds the training set out as data.validation too."""
    collate = "{collate_param: {model_name: magihuman}" if model == "magihuman" else "{collator_id: pixtral"
    text = MODELS[model]
    if features:
        text += f"features: {{{features}}}\n"
    text += f"data:\n  dataset_param: {dataset(model, data)}\n"
    if validation:
        text += f"  validation: {dataset(model, data)}\n"
    text += (f"  dataloader_param: {collate}, shuffle: true}}\n"
             f"training: {{train_iters: {steps}, global_batch_size: {global_batch}, lr: 1.0e-4, "
             f"lr_decay_style: constant, clip_grad: 1.0, seed: 5{training}}}\n"
             f"logging: {{output_dir: {out}}}\n")
    return text


def fixture_args(model: str, data: Path, samples: int) -> list:
    """`mmtrain fixture` arguments that write the bench's set of SAMPLES samples to DATA."""
    args = ["fixture", model, "--out", str(data), "--samples", str(samples), "--seed", "3", "--mix"]
    if model == "magihuman":
        args += ["--video-grid", "8,8,8", "--audio-tokens", "32", "--text-tokens", "48", "--video-channels", "64",
                 "--audio-channels", "32", "--text-channels", "64"]
    return args


if __name__ == "__main__":  # for the shell benches: bench_models.py config MODEL DATA OUT STEPS GLOBAL | fixture MODEL DATA SAMPLES
    import sys
    what, model, data = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if model not in MODELS:
        raise SystemExit(f"bench: MODEL must be one of {sorted(MODELS)}, found '{model}'")
    if what == "config":
        print(config(model, data, Path(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])), end="")
    else:
        print("\n".join(fixture_args(model, data, int(sys.argv[4]))))
