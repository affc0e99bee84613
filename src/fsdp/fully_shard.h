// FSDP2 for mmtrain modules: parameter groups ("units") chosen by module patterns plus a root
// group, dim-0 torch.chunk shards held as fp32 masters (frozen params: in their compute dtype,
// with no grad and no optimizer state), all-gather in param_dtype before a
// unit runs, free after it (reshard_after_forward), re-gather in backward, reduce-scatter of
// grads in reduce_dtype into fp32 shard grads, and forward/backward prefetch.
//
// How autograd sees it: a unit's gathered params are the outputs of one custom Function
// (UnitGather) whose input is a scalar anchor. Those outputs alias the unit's gather buffers,
// so freeing a buffer (storage size 0) and re-gathering into it in backward keeps every tensor
// autograd saved valid. UnitGather's backward runs once all of the unit's param grads exist:
// that is the post-backward hook where the reduce-scatter starts. An identity Function on the
// unit's output is the pre-backward hook where the re-gather (and backward prefetch) happens.
// FSDP is the second step of the parallelize chain (parallel/parallelize.h): its block hook sees
// whether a block runs in the forward pass or again inside backward (BlockPass), and nothing else
// of the steps around it. With a replicate group (HSDP) the reduce-scattered grads are all-reduced
// across the replicas of the shard group.
//
// cpu_offload (PyTorch's CPUOffloadPolicy): the fp32 shards and their grads live in the host tier
// (offload/host_pool.h) instead of on the device, so the optimizer steps them on the host. A
// unit's shards go to the device as part of its all-gather (in prefetch order, like the gather),
// and each reduce-scattered grad comes back to the host as its reduction is drained; every value
// takes the same ops in the same order as without offload, so training is bitwise the same.
// With a disk tier in the tiers (training.offload_dir) the shards live on disk and are paged into
// host RAM only around their use (fsdp/shard_pager.h); grads stay in the host tier.
//
// Frozen params (Param::requires_grad = false: LoRA's base, Magistral's frozen tower) are
// gathered like the others but are not UnitGather's outputs, so autograd computes no gradient
// for them and the reduction skips them. A unit that holds some cannot reshard when its trained
// params' grads are in (a frozen weight is still needed for the grads of the unit's inputs): an
// identity Function on its inputs says when its backward is done (FSDP2's
// RegisterPostBackwardFunction). The root, whose params are used anywhere in the model, keeps
// frozen params gathered until finish_backward.
//
// A quantized frozen weight (Param::base_quant, QLoRA; quant/quantized_rows.h) is sharded as
// stored rows of bytes, each row its codes and its scales (whole quantization blocks; one weight
// row, or the few an nf4 block needs when a row is not whole 64-blocks): its shard lives
// in the unit's quant_flat, the gather moves those bytes (an nf4 row is 0.28x its bf16 bytes), and
// once they are in, the weight is dequantized into its gather buffer in the unit's dtype, which
// the model reads as any other frozen weight; the bytes' buffer is let go at once. Backward's
// re-gather dequantizes again. quant/ owns the format; this file moves its bytes and calls it.
// Non-goals: tensor parallelism, per-parameter placements.
#pragma once
#include "core/tensor_pool.h"
#include "dist/comm.h"
#include "fsdp/fsdp_config.h"
#include "fsdp/shard_layout.h"
#include "nn/module.h"
#include "offload/offload_tiers.h"
#include "quant/base_quant.h"

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace mmtrain {

struct FsdpParam {
  std::string name;            // full dotted name in the model
  Param* param = nullptr;
  ShardLayout layout;
  bool frozen = false;         // !param->requires_grad: held in frozen_flat, no grad, no optimizer state
  int64_t offset = 0;          // into the unit's shard_flat (trained), frozen_flat (frozen) or quant_flat (quantized)
  at::Tensor shard;            // [padded_rows, ...] view of that flat: fp32, or the gather dtype when frozen
  at::Tensor gathered;         // [W * padded_rows, ...] in the dtype it computes in; storage freed while sharded
  // Stored quantized (frozen only): quant_layout shards its stored rows (quant::QuantizedRowShape:
  // rows of quant_layout.row_numel elements, each quant_row_bytes bytes); shard is then uint8
  // [quant_layout.padded_rows, quant_row_bytes], a view of the unit's quant_flat, and quant_gathered
  // uint8 [W * quant_layout.padded_rows, quant_row_bytes] receives the gather; public_dtype is the
  // dtype the rows dequantize to (the base's), before gathered's.
  quant::BaseQuant quant = quant::BaseQuant::none;
  ShardLayout quant_layout;
  int64_t quant_row_bytes = 0;
  at::Tensor quant_gathered;
  at::ScalarType public_dtype = at::kBFloat16;

  // A trained param's [padded_rows, ...] view of a flat tensor laid out like its unit's
  // shard_flat (the shards, their grads, AdamW moments).
  at::Tensor view_of(const at::Tensor& flat) const {
    return flat.narrow(0, offset, layout.shard_numel()).view(shard.sizes());
  }
};

class Fsdp;
class ShardPager;

struct FsdpUnit {
  enum class State { sharded, gathering, unsharded };
  std::string name;            // module name, "" for the root
  Module* module = nullptr;    // null for the root
  bool is_root = false;
  std::vector<FsdpParam> params;
  at::ScalarType gather_dtype = at::kFloat;  // param_dtype, or fp32 for a unit that computes in fp32 (plan.h)
  at::Tensor shard_flat;       // fp32 [S], S = sum of the trained params' padded shard sizes: the optimizer's params (host tier with cpu_offload)
  at::Tensor grad_flat;        // fp32 [S]: accumulated, reduced grads (host tier with cpu_offload)
  // gather_dtype [F]: the frozen params' shards, kept in the dtype they compute in (a LoRA base in
  // bf16 costs 2 bytes a parameter, not 4 + 4 + 8); never paged to disk (host tier with cpu_offload).
  at::Tensor frozen_flat;
  at::Tensor quant_flat;       // uint8 [Q]: the quantized frozen weights' rows (host tier with cpu_offload)
  bool grad_is_zero = true;    // grad_flat holds zeros (since zero_grad): the reduction writes, not adds
  at::Tensor anchor;           // scalar leaf that makes UnitGather part of the graph
  State state = State::sharded;
  // A unit with frozen params may reshard in backward only when both its grads are reduced and
  // the grads of its inputs exist (a frozen weight is still needed for them after the last
  // trained param's grad): the inputs' hooks still to fire, and whether the reduction started.
  int inputs_pending = 0;
  bool grads_reduced = false;
  CommWork gather_work;
  size_t order = 0;            // position in forward order
  Fsdp* engine = nullptr;      // the engine the autograd Functions call back into
};

// read(name, row_begin, row_end) returns those rows of the full tensor (any float dtype).
using RowReader = std::function<at::Tensor(const std::string& name, int64_t row_begin, int64_t row_end)>;
// A quantized weight's stored rows [row_begin, row_end) as bytes (quant/quantized_rows.h: uint8
// [rows, row_bytes] in `kind`; a stored row is QuantizedRowShape::group weight rows), and the
// public dtype they dequantize to.
struct QuantizedRows {
  at::Tensor bytes;
  at::ScalarType public_dtype = at::kBFloat16;
};
using QuantRowReader =
    std::function<QuantizedRows(const std::string& name, quant::BaseQuant kind, int64_t row_begin, int64_t row_end)>;

struct FsdpMemoryStats {
  int64_t param_bytes = 0;     // shards: fp32 trained ones and the frozen ones in their dtype
  int64_t grad_bytes = 0;
  int64_t unsharded_param_bytes = 0;  // what all units would take gathered (param_dtype)
};

// How the gradient reduction spans the mesh beyond the shard group.
struct FsdpReduction {
  // HSDP: the replicas of this shard group (same shards, other data); their reduce-scattered
  // grads are all-reduced. Null or one rank: none.
  std::shared_ptr<Comm> replicate;
  // Ranks with distinct data, whose grads are averaged; 0 = the shard group's size. Fewer when
  // the shard group spans context-parallel ranks: their grads are shares of one sample's and add.
  int data_parallel = 0;
};

class Fsdp {
 public:
  // Builds units over model (config.apply_modules; reshard_after_forward never applies to the
  // root, as FSDP2's default), allocates zeroed fp32 shards on device and installs the unit
  // hooks on the unit blocks; no full tensor is materialized. ignored_modules is not
  // implemented: set, it is refused here. config.cpu_offload needs `tiers` (the host pool the
  // shards and grads live in, and the copy stream that moves them).
  Fsdp(Module& model, std::shared_ptr<Comm> comm, FsdpConfig config, at::Device device = at::kCPU,
       FsdpReduction reduction = {}, std::shared_ptr<OffloadTiers> tiers = nullptr);
  ~Fsdp();
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  // Fills this rank's rows of every param from read_rows (cast to the shard's dtype here);
  // frozen_too false: the frozen params keep what they hold (a LoRA base under its adapters).
  // A quantized frozen weight reads its rows through read_quantized (without it: read_rows' values
  // quantized here, a whole tensor at a time).
  void load_params(const RowReader& read_rows, bool frozen_too = true, const QuantRowReader& read_quantized = {});
  // Fresh init: every Param's init rule with a generator seeded from (seed, param index), so
  // all world sizes produce the same model.
  void init_params(uint64_t seed);

  // Gathers the root group; call before each micro-batch's forward.
  void begin_forward();
  // Waits for outstanding reduce-scatters (and the replica all-reduce) and accumulates them,
  // divided by the data-parallel size, into grad_flat; call after each micro-batch's backward.
  void finish_backward();
  // After forwards without a backward (evaluation, under no-grad): every unit lets go of its
  // gathered params, the root included.
  void finish_forward_only();
  // Forwards without a backward that keep every unit gathered once it has run, until
  // finish_forward_only: token-by-token generation, whose decoder calls would otherwise gather and
  // free the whole model once per token (TRL's gather for generation under ZeRO-3 likewise). The
  // model's params in param_dtype are all held meanwhile.
  void begin_forward_held();
  void zero_grad();
  // Global L2 norm of the grads across all shards; scales them by max_norm / (norm + 1e-6)
  // when that is below 1 (torch.nn.utils.clip_grad_norm_). max_norm <= 0: only measures.
  // local_non_finite: this rank's state is known to be non-finite (train/state_finite.h): its
  // share of the norm is NaN, so every rank sees a NaN norm from the reduction that runs anyway.
  double clip_grad_norm(double max_norm, bool local_non_finite = false);
  // Milliseconds this rank spent blocked in waits for collectives (all-gathers, reduce-scatters,
  // the replica all-reduce) since the last call; resets the count.
  double take_comm_wait_ms();
  // Bytes this rank's all-gathers received from the other ranks since the last call (a quantized
  // base's count as its rows of codes and scales); resets the count.
  int64_t take_gathered_bytes();

  std::vector<FsdpUnit*> units();
  const Comm& comm() const { return *comm_; }
  Comm& comm() { return *comm_; }
  // Whether this rank writes the shard group's shards to checkpoints: replicas hold the same
  // shards, and only the first writes them.
  bool is_primary_replica() const { return !reduction_.replicate || reduction_.replicate->rank() == 0; }
  const FsdpConfig& config() const { return config_; }
  at::Device device() const { return device_; }
  // Where shard_flat and grad_flat live, and so where the optimizer steps: the host with
  // cpu_offload, else the device.
  at::Device shard_device() const { return config_.cpu_offload ? at::Device(at::kCPU) : device_; }
  // cpu_offload with a disk tier: the pager that holds the shards on disk; else null.
  ShardPager* shard_pager() const { return pager_.get(); }
  // Whether unit.shard_flat holds its values in memory now (always, without a pager).
  bool shard_resident(const FsdpUnit& unit) const;
  FsdpMemoryStats memory_stats() const;

  // Hooks, called by the unit block hook / the autograd Functions.
  void pre_forward(FsdpUnit& unit);
  at::Tensor post_forward(FsdpUnit& unit, at::Tensor output, bool install_pre_backward);
  void pre_backward(FsdpUnit& unit);
  // grads: one per trained param of the unit, in order.
  void post_backward(FsdpUnit& unit, const std::vector<at::Tensor>& grads);
  // A unit with frozen params: hooks the inputs that require grad (their backward says the
  // unit's backward is done); returns them, or inputs unchanged for a unit without.
  std::vector<at::Tensor> hook_inputs(FsdpUnit& unit, const std::vector<at::Tensor>& inputs);
  void input_grads_done(FsdpUnit& unit);
  void reshard(FsdpUnit& unit);
  void unshard_and_materialize(FsdpUnit& unit);

 private:
  void fill_shard(FsdpParam& p, const RowReader& read_rows);
  // One param's rows: fill_shard, or for a quantized weight fill_quantized_shard from read_quantized
  // (empty: read_rows' values quantized here, the whole tensor at once).
  void fill_param(FsdpParam& p, const RowReader& read_rows, const QuantRowReader& read_quantized);
  void fill_quantized_shard(FsdpParam& p, const QuantRowReader& read_quantized);
  // The gathered bytes of a quantized weight -> its gather buffer, dequantized.
  void dequantize_gathered(FsdpParam& p);
  // A gather buffer's memory comes from, and goes back to, a small per-size free list: every
  // unit of a transformer gathers the same sizes, and a fresh allocation of tens of MB per
  // gather costs page faults (glibc hands such sizes back to the kernel on free).
  void acquire_gather_storage(const at::Tensor& t);
  void release_gather_storage(const at::Tensor& t);
  void unshard_async(FsdpUnit& unit);
  // The end of a unit with frozen params' backward: reshards once both of its signals came.
  void reshard_if_backward_done(FsdpUnit& unit);
  void wait_unshard(FsdpUnit& unit);
  void drain_reductions(size_t keep_in_flight);
  // Runs wait() and adds the time it blocked to comm_wait_ms_.
  void timed_wait(CommWork& work);

  struct PendingReduction {
    FsdpUnit* unit;
    bool overwrite;     // the first grad since zero_grad, reduced in fp32: it is the grad, not added to it
    at::Tensor staged;  // reduce_dtype [W, S] when some grads needed staging, back to the pool after the wait
    at::Tensor output;  // reduce_dtype [S]; unit->grad_flat itself when written in place
    CommWork work;
  };

  std::shared_ptr<Comm> comm_;
  FsdpConfig config_;
  at::Device device_;
  FsdpReduction reduction_;
  std::shared_ptr<OffloadTiers> tiers_;  // cpu_offload: the host tier; else null
  std::unique_ptr<ShardPager> pager_;    // cpu_offload with a disk tier
  bool held_ = false;  // begin_forward_held: no unit reshards after its forward
  bool in_backward_ = false;             // which way the gathers walk the units (the pager reads ahead that way)
  std::vector<std::unique_ptr<FsdpUnit>> units_;  // forward order; the root first
  std::deque<PendingReduction> pending_;
  // Every unit of a transformer reduces the same sizes, so its buffers are reused instead of
  // allocated per unit. The reduce pool (staged grads, outputs and Gloo's receive buffers)
  // empties at the end of each backward, so its buffers never add to the forward pass's peak.
  TensorPool reduce_buffers_;
  double comm_wait_ms_ = 0;
  int64_t gathered_bytes_ = 0;
  std::unordered_map<size_t, std::vector<at::DataPtr>> free_gather_storage_;  // nbytes -> buffers
};

}  // namespace mmtrain
