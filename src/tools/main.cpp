// mmtrain: the command-line entry point. Subcommands:
//   train CONFIG [--set key=value ...]   train (under torchrun for several ranks)
//   fixture tokens --out FILE ...         synthetic token data for tests and the demo
//   convert MODEL hf-to-ckpt | ckpt-to-hf between the public HF layout and mmtrain checkpoints
//   debug step CONFIG --batch B --out O   one forward/backward, dumps loss, outputs and grads
//   fixture magihuman --out DIR ...       synthetic MagiHuman precomputed samples (latents, audio, text)
//   fixture magihuman-weights --config CFG --out DIR   random MagiHuman weights in the HF layout
//   fixture mistral3 --out DIR ...       image-text SFT set for tiny mistral3 configs
//   debug collate CONFIG --out FILE       one collated micro-batch of a config, as safetensors
//   plan CONFIG --world-size N [--seqlen L]   per-rank memory without allocating (docs/tools.md)
//   logs parse FILE | summary FILE | compare A B     training logs (metrics.jsonl or Megatron lines) as JSON / compared
//   flops magihuman (--config CFG | --ckpt DIR) --seqlens ...   model FLOPs, TFLOP/s, MFU (docs/flops.md)
//   flops mistral3 --config CFG --seqlens ... [--images HxW,...]   the same for Magistral (docs/flops.md)
//   measure gemm [--size N --threads T --dtype fp32|bf16]   GEMM FLOP/s reached here (CPU peak for MFU)
#include "core/config.h"
#include "core/error.h"
#include "dist/runtime.h"
#include "tools/builtins.h"
#include "tools/convert.h"
#include "tools/debug.h"
#include "tools/debug_image.h"
#include "tools/fixture.h"
#include "tools/gemm_peak.h"
#include "tools/flops.h"
#include "tools/logs.h"
#include "tools/plan.h"
#include "tools/tokenize.h"
#include "train/trainer.h"

#include <CLI/CLI.hpp>

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <tuple>
#include <cstdio>

namespace mmtrain {
void register_test_models();
}

namespace {

// A crash in a multi-rank job otherwise shows up only as the peers' "connection reset": print
// where this rank died before the default handler ends it.
void print_backtrace_and_die(int signal_number) {
  void* frames[64];
  const int count = backtrace(frames, 64);
  const char header[] = "mmtrain: fatal signal, backtrace:\n";
  (void)!write(STDERR_FILENO, header, sizeof(header) - 1);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mmtrain;
  std::signal(SIGSEGV, print_backtrace_and_die);
  std::signal(SIGBUS, print_backtrace_and_die);
  std::signal(SIGABRT, print_backtrace_and_die);
  CLI::App app{"mmtrain: FSDP2 training for large multimodal models"};
  app.require_subcommand(1);

  auto* train = app.add_subcommand("train", "train a model from a YAML config (launch with torchrun for N ranks)");
  std::string config_path;
  std::vector<std::string> overrides;
  train->add_option("config", config_path, "YAML config file")->required();
  train->add_option("--set", overrides, "override a config key: --set training.lr=3e-4 (repeatable)");

  auto* fixture = app.add_subcommand("fixture", "generate synthetic data / weights");
  fixture->require_subcommand(1);
  auto* tokens = fixture->add_subcommand("tokens", "token data: safetensors `tokens` int64 [samples, seq_len]");
  std::string out_path;
  int64_t samples = 256, seq_len = 65, vocab = 128;
  uint64_t seed = 0;
  tokens->add_option("--out", out_path, "output .safetensors file")->required();
  tokens->add_option("--samples", samples, "number of samples")->capture_default_str();
  tokens->add_option("--seq-len", seq_len, "tokens per sample (the model sees seq_len - 1)")->capture_default_str();
  tokens->add_option("--vocab", vocab, "vocabulary size")->capture_default_str();
  tokens->add_option("--seed", seed, "random seed")->capture_default_str();
  bool learnable = false;
  tokens->add_flag("--learnable", learnable, "noisy affine sequences a model can learn (default: uniform noise)");

  auto* mh = fixture->add_subcommand("magihuman", "MagiHuman precomputed samples: DIR/{latents,audio_latents,conditions}/");
  std::string mh_out, mh_grid = "32,8,15";
  MagiHumanDataFixture mh_options;
  mh->add_option("--out", mh_out, "output .precomputed directory")->required();
  mh->add_option("--samples", mh_options.samples, "number of samples")->capture_default_str();
  mh->add_option("--seed", mh_options.seed, "random seed of the clean latents")->capture_default_str();
  mh->add_option("--video-grid", mh_grid, "video token grid T,H',W'")->capture_default_str();
  mh->add_option("--audio-tokens", mh_options.audio_tokens, "audio latent rows")->capture_default_str();
  mh->add_option("--text-tokens", mh_options.text_tokens, "text embedding rows")->capture_default_str();
  mh->add_option("--video-channels", mh_options.video_channels, "video token width (latent channels x 4)")->capture_default_str();
  mh->add_option("--audio-channels", mh_options.audio_channels, "audio latent width")->capture_default_str();
  mh->add_option("--text-channels", mh_options.text_channels, "text embedding width")->capture_default_str();
  mh->add_option("--format", mh_options.format, "pt (torch.save) or safetensors")
      ->check(CLI::IsMember({"pt", "safetensors"}))
      ->capture_default_str();

  auto* mhw = fixture->add_subcommand("magihuman-weights", "random MagiHuman weights in the public HF layout (sharded safetensors + index)");
  std::string mhw_config, mhw_out;
  int64_t mhw_shards = 0;
  uint64_t mhw_seed = 0;
  mhw->add_option("--config", mhw_config, "YAML config whose model.config sets the dimensions")->required();
  mhw->add_option("--out", mhw_out, "output directory")->required();
  mhw->add_option("--shards", mhw_shards, "number of shards (default min(7, tensors))");
  mhw->add_option("--seed", mhw_seed, "random seed")->capture_default_str();

  auto* debug = app.add_subcommand("debug", "inspect one stage of the pipeline");
  debug->require_subcommand(1);
  auto* collate = debug->add_subcommand("collate", "write one collated micro-batch of a config as safetensors");
  std::string collate_config, collate_out;
  std::vector<std::string> collate_overrides;
  DebugCollateOptions collate_options;
  collate->add_option("config", collate_config, "YAML config file")->required();
  collate->add_option("--out", collate_out, "output .safetensors file")->required();
  collate->add_option("--step", collate_options.step, "0-based optimizer step")->capture_default_str();
  collate->add_option("--micro", collate_options.micro, "micro-batch within the step")->capture_default_str();
  collate->add_option("--rank", collate_options.rank, "data-parallel rank")->capture_default_str();
  collate->add_option("--world", collate_options.world, "data-parallel world size")->capture_default_str();
  collate->add_option("--set", collate_overrides, "override a config key (repeatable)");
  auto* step = debug->add_subcommand("step", "one forward + backward on a batch; writes loss, outputs and HF-layout grads");
  std::string batch_path, debug_out;
  step->add_option("config", config_path, "YAML config")->required();
  step->add_option("--set", overrides, "override a config key (repeatable)");
  step->add_option("--batch", batch_path, "batch as safetensors (the collator's keys)")->required();
  step->add_option("--out", debug_out, "output .safetensors")->required();

  // Hidden (empty group): the tokenizer parity tests' entry point.
  auto* tokenize = debug->add_subcommand("tokenize", "tokenize a JSONL of strings (parity tests)")->group("");
  DebugTokenizeOptions tokenize_options;
  tokenize->add_option("--tokenizer", tokenize_options.tokenizer_path, "tekken.json or tokenizer.json")->required();
  tokenize->add_option("--format", tokenize_options.format, "tekken | hf | auto")
      ->check(CLI::IsMember({"tekken", "hf", "auto"}))
      ->capture_default_str();
  tokenize->add_flag("--fix-mistral-regex", tokenize_options.fix_mistral_regex, "hf: transformers' fix_mistral_regex");
  tokenize->add_flag("--split-special-tokens", tokenize_options.split_special_tokens, "hf: no added special tokens from text");
  tokenize->add_option("--in", tokenize_options.in_path, "JSONL, one JSON string per line")->required();
  tokenize->add_option("--out", tokenize_options.out_path, "JSONL, one {ids, text} per line")->required();
  // Hidden (group ""): the Pixtral image pipeline on one file, for the parity tests.
  auto* debug_img = debug->add_subcommand("image", "Pixtral image pipeline on one image (tools/debug_image.h)")->group("");
  std::string image_in, image_out;
  DebugImageOptions image_options;
  debug_img->add_option("--in", image_in, "image file (PNG, JPEG, ...)")->required();
  debug_img->add_option("--out", image_out, "output .safetensors")->required();
  debug_img->add_flag("--align-to-patch", image_options.align_to_patch, "multiples of patch_size (LLaMA-Factory), not patch*merge");
  debug_img->add_flag("--with-decoded", image_options.with_decoded, "also write the decoded RGB image");

  auto* convert = app.add_subcommand("convert", "convert weights between the public HF layout and mmtrain checkpoints");
  convert->require_subcommand(1);
  // One hf-to-ckpt / ckpt-to-hf pair per model (seed spellings: MagiHumanConverter,
  // Mistral3Converter with hf_to_dcp / dcp_to_hf).
  std::string hf_dir, save_dir, load_dir, assets_dir, convert_config;
  struct ConvertCommands {
    std::string model_id;
    CLI::App* hf_to_ckpt;
    CLI::App* ckpt_to_hf;
  };
  std::vector<ConvertCommands> converters;
  for (const auto& [model_id, seed_name, what] :
       {std::tuple<std::string, std::string, std::string>{"magihuman", "MagiHumanConverter", "MagiHuman DiT"},
        {"mistral3", "Mistral3Converter", "Mistral3 (Magistral-Small-2509)"}}) {
    auto* model_cmd = convert->add_subcommand(model_id, what + " (seed spelling: " + seed_name + ")");
    model_cmd->alias(seed_name);
    model_cmd->require_subcommand(1);
    auto* to_ckpt = model_cmd->add_subcommand("hf-to-ckpt", "HF directory -> model-only checkpoint");
    to_ckpt->alias("hf_to_dcp");
    to_ckpt->add_option("--hf_dir", hf_dir, "HF directory (safetensors shards + index)")->required();
    to_ckpt->add_option("--save_dir", save_dir, "checkpoint root to write (iter_0000000 + latest)")->required();
    to_ckpt->add_option("--config", convert_config,
                        "YAML whose model.config describes the model (default: the directory's config.json; "
                        "MagiHuman: inferred from the tensor shapes)");
    auto* to_hf = model_cmd->add_subcommand("ckpt-to-hf", "checkpoint -> HF layout like the reference");
    to_hf->alias("dcp_to_hf");
    to_hf->add_option("--load_dir", load_dir, "checkpoint iter_N directory or save root")->required();
    to_hf->add_option("--save_dir", save_dir, "output HF directory")->required();
    to_hf->add_option("--model_assets_dir", assets_dir, "reference HF directory: shard names, key order, dtypes, other files")
        ->required();
    converters.push_back({model_id, to_ckpt, to_hf});
  }

  auto* flops = app.add_subcommand("flops", "model FLOPs, TFLOP/s per device and MFU (docs/flops.md)");
  flops->require_subcommand(1);
  auto* flops_mh = flops->add_subcommand("magihuman", "MagiHuman, in the seed's flops_magihuman.py convention");
  FlopsOptions flops_options;
  auto* flops_config = flops_mh->add_option("--config", flops_options.config_path, "mmtrain YAML (model.config)");
  auto* flops_ckpt = flops_mh->add_option("--ckpt", flops_options.ckpt_dir, "HF checkpoint dir (shapes from headers)");
  flops_config->excludes(flops_ckpt);
  flops_mh->add_option("--set", flops_options.overrides, "override a key of --config (repeatable)");
  flops_mh->add_option("--seqlens", flops_options.seqlens, "per-sample sequence lengths")->required();
  flops_mh->add_option("--gbs", flops_options.global_batch_size, "global batch size (samples per step)")
      ->capture_default_str();
  flops_mh->add_option("--device_num,--device-num", flops_options.device_num, "devices")->capture_default_str();
  flops_mh->add_option("--step_time,--step-time", flops_options.step_time, "seconds per step (0: no throughput)")
      ->capture_default_str();
  flops_mh->add_option("--hardware_flops,--hardware-flops", flops_options.hardware_flops,
                       "peak FLOP/s per device (0: no MFU)")
      ->capture_default_str();
  flops_mh->add_option("--attention-coefficient,--attention_coefficient", flops_options.attention_coefficient,
                       "FLOPs per s^2*head_dim*heads*layer: the seed's 7; full bidirectional attention is ~2x")
      ->capture_default_str();
  auto* flops_m3 = flops->add_subcommand("mistral3", "Mistral3 / Magistral, spec magistral.md §9 (causal attention)");
  FlopsOptions flops_m3_options;
  flops_m3->add_option("--config", flops_m3_options.config_path, "mmtrain YAML (model.config)")->required();
  flops_m3->add_option("--set", flops_m3_options.overrides, "override a key of --config (repeatable)");
  flops_m3->add_option("--seqlens", flops_m3_options.seqlens, "per-sample sequence lengths, [IMG] tokens included")
      ->required()
      ->delimiter(',');
  flops_m3->add_option("--images", flops_m3_options.images, "HxW in pixels of every image of those samples")
      ->delimiter(',');
  flops_m3->add_option("--gbs", flops_m3_options.global_batch_size, "global batch size (samples per step)")
      ->capture_default_str();
  flops_m3->add_option("--device_num,--device-num", flops_m3_options.device_num, "devices")->capture_default_str();
  flops_m3->add_option("--step_time,--step-time", flops_m3_options.step_time, "seconds per step (0: no throughput)")
      ->capture_default_str();
  flops_m3->add_option("--hardware_flops,--hardware-flops", flops_m3_options.hardware_flops,
                       "peak FLOP/s per device (0: no MFU)")
      ->capture_default_str();

  auto* plan = app.add_subcommand("plan", "per-rank memory of a run, from shapes only (docs/tools.md)");
  PlanOptions plan_options;
  plan->add_option("config", plan_options.config_path, "YAML config file")->required();
  plan->add_option("--world-size,--world_size", plan_options.world_size, "ranks")->capture_default_str();
  plan->add_option("--seqlen", plan_options.seqlen, "tokens per sample (default: the model's)");
  plan->add_option("--set", plan_options.overrides, "override a config key (repeatable)");

  auto* logs = app.add_subcommand("logs", "training logs: metrics.jsonl or Megatron-style console lines (docs/tools.md)");
  logs->require_subcommand(1);
  auto* logs_parse_cmd = logs->add_subcommand("parse", "print one normalized JSON record per iteration");
  std::string log_a, log_b;
  logs_parse_cmd->add_option("file", log_a, "log file")->required();
  LogStatsOptions log_stats;
  auto* logs_summary_cmd = logs->add_subcommand("summary", "one run: steady-state step time, throughput, MFU, loss");
  logs_summary_cmd->add_option("file", log_a, "log file")->required();
  logs_summary_cmd->add_option("--skip-first,--skip_first", log_stats.skip_first, "warm-up iterations left out")
      ->capture_default_str();
  auto* logs_compare_cmd = logs->add_subcommand("compare", "loss agreement, step time and throughput of two runs");
  logs_compare_cmd->add_option("a", log_a, "log of run A")->required();
  logs_compare_cmd->add_option("b", log_b, "log of run B (the reference)")->required();
  logs_compare_cmd->add_option("--skip-first,--skip_first", log_stats.skip_first, "warm-up iterations left out of step times")
      ->capture_default_str();
  logs_compare_cmd->add_option("--window", log_stats.window, "also average the last W iterations (0: off)")
      ->capture_default_str();

  auto* measure = app.add_subcommand("measure", "measure this machine");
  measure->require_subcommand(1);
  auto* gemm = measure->add_subcommand("gemm", "GEMM FLOP/s reached here (the CPU stand-in for a peak, for MFU)");
  int64_t gemm_size = 1024;
  int gemm_threads = 1, gemm_repeats = 10;
  std::string gemm_dtype = "fp32";
  gemm->add_option("--size", gemm_size, "square matrix size")->capture_default_str();
  gemm->add_option("--threads", gemm_threads, "intra-op threads (a torchrun rank here uses OMP_NUM_THREADS)")
      ->capture_default_str();
  gemm->add_option("--repeats", gemm_repeats, "timed repeats (the median is reported)")->capture_default_str();
  gemm->add_option("--dtype", gemm_dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();

  auto* m3 = fixture->add_subcommand("mistral3", "image-text SFT set for mistral3: tekken.json, images/, conversations.json");
  std::string m3_out;
  Mistral3DataFixture m3_options;
  m3->add_option("--out", m3_out, "output directory")->required();
  m3->add_option("--samples", m3_options.samples, "number of good records")->capture_default_str();
  m3->add_option("--seed", m3_options.seed, "random seed")->capture_default_str();
  m3->add_option("--min-side", m3_options.min_side, "smallest image side in pixels")->capture_default_str();
  m3->add_option("--max-side", m3_options.max_side, "largest image side in pixels")->capture_default_str();
  m3->add_flag("--bad-records", m3_options.bad_records, "append one record per reason the dataset drops");

  CLI11_PARSE(app, argc, argv);
  try {
    register_builtins();
    register_test_models();
    if (train->parsed()) {
      auto config = config_load(config_path, overrides);
      auto runtime = runtime_init(LaunchEnv::from_environment(), default_device());
      Trainer trainer(std::move(config), std::move(runtime));
      trainer.run();
    } else if (m3->parsed()) {
      fixture_mistral3_data(m3_out, m3_options);
    } else if (convert->parsed()) {
      for (const auto& c : converters) {
        if (c.hf_to_ckpt->parsed()) convert_hf_to_ckpt(c.model_id, convert_config, hf_dir, save_dir);
        if (c.ckpt_to_hf->parsed()) convert_ckpt_to_hf(c.model_id, load_dir, save_dir, assets_dir);
      }
    } else if (step->parsed()) {
      debug_step(config_path, overrides, batch_path, debug_out);
    } else if (gemm->parsed()) {
      auto peak = measure_gemm_peak(gemm_size, gemm_dtype == "bf16" ? at::kBFloat16 : at::kFloat, gemm_threads, gemm_repeats);
      std::printf("{\"gemm_flops\": %.6g, \"size\": %lld, \"threads\": %d, \"dtype\": \"%s\"}\n",
                  peak.flops_per_second, static_cast<long long>(peak.size), peak.threads, gemm_dtype.c_str());
    } else if (tokens->parsed()) {
      fixture_tokens(out_path, samples, seq_len, vocab, seed, learnable);
      std::printf("wrote %s\n", out_path.c_str());
    } else if (mh->parsed()) {
      mh_options.video_grid = parse_video_grid(mh_grid);
      fixture_magihuman_data(mh_out, mh_options);
      std::printf("wrote %lld samples to %s\n", static_cast<long long>(mh_options.samples), mh_out.c_str());
    } else if (mhw->parsed()) {
      fixture_magihuman_weights(mhw_config, mhw_out, mhw_shards, mhw_seed);
      std::printf("wrote %s\n", mhw_out.c_str());
    } else if (debug_img->parsed()) {
      debug_image(image_in, image_out, image_options);
    } else if (collate->parsed()) {
      debug_collate(collate_config, collate_overrides, collate_out, collate_options);
      std::printf("wrote %s\n", collate_out.c_str());
    } else if (tokenize->parsed()) {
      debug_tokenize(tokenize_options);
    } else if (logs_parse_cmd->parsed()) {
      logs_parse(log_a);
    } else if (logs_summary_cmd->parsed()) {
      logs_summary(log_a, log_stats);
    } else if (logs_compare_cmd->parsed()) {
      logs_compare(log_a, log_b, log_stats);
    } else if (plan->parsed()) {
      plan_memory(plan_options);
    } else if (flops_mh->parsed()) {
      flops_magihuman(flops_options);
    } else if (flops_m3->parsed()) {
      flops_mistral3(flops_m3_options);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "mmtrain: error: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    // From LibTorch or c10d (e.g. a peer rank died): the message without LibTorch's C++ frames.
    std::fprintf(stderr, "mmtrain: error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mmtrain: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
