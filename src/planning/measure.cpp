// `mmtrain measure ...`: what this machine reaches, for MFU denominators and scaling figures.
#include "cli/command.h"
#include "core/error.h"
#include "planning/cp_attention_bench.h"
#include "planning/gemm_peak.h"
#include "planning/measure_profile.h"

#include <ATen/Context.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

namespace mmtrain {

void add_measure_commands(CLI::App& app, Commands& commands) {
  auto* measure = app.add_subcommand("measure", "measure this machine");
  measure->require_subcommand(1);

  struct GemmArgs {
    int64_t size = 1024;
    int threads = 1, repeats = 10;
    std::string dtype = "fp32", device = "cpu";
  };
  auto g = std::make_shared<GemmArgs>();
  auto* gemm = measure->add_subcommand("gemm", "GEMM FLOP/s reached here (the CPU stand-in for a peak, for MFU)");
  gemm->add_option("--size", g->size, "square matrix size")->capture_default_str();
  gemm->add_option("--threads", g->threads, "intra-op threads (a torchrun rank here uses OMP_NUM_THREADS)")
      ->capture_default_str();
  gemm->add_option("--repeats", g->repeats, "timed repeats (the median is reported)")->capture_default_str();
  gemm->add_option("--dtype", g->dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  gemm->add_option("--device", g->device, "cpu or cuda (the first GPU)")->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  commands.add(gemm, [g] {
    const at::Device device = g->device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
    if (device.is_cuda() && !at::hasCUDA()) fail("measure gemm --device cuda: this mmtrain or machine has no CUDA");
    const auto peak = measure_gemm_peak(g->size, g->dtype == "bf16" ? at::kBFloat16 : at::kFloat, g->threads, g->repeats,
                                        device);
    std::printf("{\"gemm_flops\": %.6g, \"size\": %lld, \"threads\": %d, \"dtype\": \"%s\", \"device\": \"%s\"}\n",
                peak.flops_per_second, static_cast<long long>(peak.size), peak.threads, g->dtype.c_str(),
                g->device.c_str());
  });

  auto a = std::make_shared<CpAttentionBench>();
  auto* attention = measure->add_subcommand(
      "cp-attention", "context-parallel attention forward + backward on one long sample (run under torchrun)");
  attention->add_option("--ring", a->ring, "ring degree")->capture_default_str();
  attention->add_option("--ulysses", a->ulysses, "Ulysses degree")->capture_default_str();
  attention->add_option("--seqlen", a->seqlen, "tokens of the sample")->capture_default_str();
  attention->add_option("--heads", a->heads, "query heads")->capture_default_str();
  attention->add_option("--kv-heads", a->kv_heads, "key/value heads")->capture_default_str();
  attention->add_option("--head-dim", a->head_dim, "head dim")->capture_default_str();
  attention->add_flag("--causal", a->causal, "causal attention (zigzag ring chunks)");
  attention->add_option("--dtype", a->dtype, "fp32, bf16 or fp16")->capture_default_str();
  attention->add_option("--warmup", a->warmup, "untimed repeats first")->capture_default_str();
  attention->add_option("--repeats", a->repeats, "timed repeats (the median is reported)")->capture_default_str();
  commands.add(attention, [a] { measure_cp_attention(*a); });

  auto p = std::make_shared<MeasureProfileOptions>();
  auto* profile = measure->add_subcommand(
      "profile", "a device profile of this machine for `plan --device` (docs/step_time.md)");
  profile->add_option("--out", p->out, "the profile JSON to write")->required();
  profile->add_option("--name", p->name, "the profile's name")->capture_default_str();
  profile->add_option("--disk-dir,--disk_dir", p->disk_dir, "where to measure the disk (the offload_dir to plan for)")
      ->capture_default_str();
  profile->add_option("--threads", p->threads, "intra-op threads of one rank")->capture_default_str();
  profile->add_option("--ranks", p->ranks, "thread ranks of the all-reduce")->capture_default_str();
  profile->add_option("--gemm-size,--gemm_size", p->gemm_size, "square GEMM size")->capture_default_str();
  profile->add_option("--copy-mb,--copy_mb", p->copy_mb, "MiB copied for memory bandwidth")->capture_default_str();
  profile->add_option("--allreduce-mb,--allreduce_mb", p->allreduce_mb, "MiB all-reduced")->capture_default_str();
  profile->add_option("--disk-mb,--disk_mb", p->disk_mb, "MiB written and read on the disk")->capture_default_str();
  profile->add_flag("--overwrite", p->overwrite, "replace an existing --out file");
  commands.add(profile, [p] { measure_profile(*p); });
}

}  // namespace mmtrain
