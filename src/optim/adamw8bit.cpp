#include "optim/adamw8bit.h"

#include "core/error.h"
#include "quant/dynamic_map.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <set>
#include <utility>

namespace mmtrain {
namespace {

constexpr int64_t kBlock = AdamW8bit::kBlocksize;
// Elements one task of the update takes at a time: whole blocks, small enough that its fp32
// moments stay in cache between the dequantize, the update and the quantize.
constexpr int64_t kChunk = 64 * kBlock;

}  // namespace

void AdamW8bit::UnitState::bind(at::Tensor buffer) {
  memory = std::move(buffer);
  int64_t at = 0;
  for (int m = 0; m < 2; ++m, at += absmax_numel) absmax[m] = memory.narrow(0, at, absmax_numel);
  for (int m = 0; m < 2; ++m, at += small_numel) small[m] = memory.narrow(0, at, small_numel);
  const at::Tensor code_bytes = memory.narrow(0, at, floats() - at).view(at::kByte);
  for (int m = 0; m < 2; ++m) codes[m] = code_bytes.narrow(0, m * shard_numel, shard_numel);
}

AdamW8bit::AdamW8bit(std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                     std::vector<std::vector<ShardedParamSpan>> spans, int rank, AdamW8bitOptions options,
                     AllReduceMax all_reduce_max, StateAllocator allocate, std::shared_ptr<DiskStore> disk)
    : params_(std::move(params)),
      grads_(std::move(grads)),
      disk_(std::move(disk)),
      options_(options),
      all_reduce_max_(std::move(all_reduce_max)) {
  if (params_.size() != grads_.size() || params_.size() != spans.size())
    fail("AdamW8bit: ", params_.size(), " params, ", grads_.size(), " grads and ", spans.size(), " span lists");
  if (options_.min_8bit_size < 0) fail("AdamW8bit: min_8bit_size must be >= 0, found ", options_.min_8bit_size);
  if (!allocate)
    allocate = [](int64_t numel, at::ScalarType dtype, const at::Tensor&) { return at::zeros({numel}, dtype); };
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& flat = params_[i];
    if (flat.scalar_type() != at::kFloat || flat.dim() != 1 || flat.device().type() != at::kCPU)
      fail("AdamW8bit: params must be 1-D fp32 CPU flat shards (its update is bitsandbytes' CPU kernel), got ",
           flat.scalar_type(), " ", flat.sizes(), " on ", flat.device());
    UnitState unit;
    unit.slot_begin = exchange_slots_;
    int64_t absmax_total = 0, small_total = 0;
    for (const auto& param : spans[i]) {
      const auto& b = param.rank_begins;
      if (b.size() < 2 || rank < 0 || rank + 1 >= static_cast<int>(b.size()) || b.front() != 0 || b.back() != param.numel ||
          !std::is_sorted(b.begin(), b.end()))
        fail("AdamW8bit: param '", param.name, "': rank_begins must rise from 0 to its ", param.numel,
             " elements with one entry per rank and rank ", rank, " among them");
      Span span;
      span.param = param;
      span.begin = b[rank];
      span.end = b[rank + 1];
      if (param.shard_offset < 0 || param.shard_offset + (span.end - span.begin) > flat.numel())
        fail("AdamW8bit: param '", param.name, "' at ", param.shard_offset, " overruns its unit's shard of ", flat.numel());
      span.eight_bit = param.numel >= options_.min_8bit_size;
      if (span.eight_bit) {
        if (span.end > span.begin) {
          span.first_block = span.begin / kBlock;
          span.blocks = (span.end - 1) / kBlock - span.first_block + 1;
        }
        span.absmax_at = absmax_total;
        absmax_total += span.blocks;
        // Every rank numbers the straddling blocks of every param the same way.
        std::set<int64_t> straddling;
        for (size_t r = 1; r + 1 < b.size(); ++r)
          if (b[r] > 0 && b[r] < param.numel && b[r] % kBlock != 0) straddling.insert(b[r] / kBlock);
        for (const int64_t block : straddling) {
          if (block >= span.first_block && block < span.first_block + span.blocks) span.shared.push_back({block, exchange_slots_});
          ++exchange_slots_;
        }
      } else {
        span.small_at = small_total;
        small_total += span.end - span.begin;
      }
      unit.spans.push_back(std::move(span));
    }
    unit.slot_end = exchange_slots_;
    unit.shard_numel = flat.numel();
    unit.absmax_numel = absmax_total;
    unit.small_numel = small_total;
    if (disk_)  // zeros until first written: the state never exists in RAM whole
      unit.disk_offset = disk_->reserve(unit.floats() * static_cast<int64_t>(sizeof(float)));
    else
      unit.bind(allocate(unit.floats(), at::kFloat, flat));
    units_.push_back(std::move(unit));
  }
}

AdamW8bit::~AdamW8bit() {
  for (auto& unit : units_)
    if (unit.arriving.valid()) unit.arriving.wait();  // the I/O thread writes into unit.incoming
}

void AdamW8bit::read_ahead(size_t i) const {
  UnitState& unit = units_[i];
  if (!disk_ || unit.memory.defined() || unit.incoming.defined()) return;
  unit.incoming = aligned_buffer(unit.floats());
  if (unit.floats() > 0)
    unit.arriving = disk_->read(unit.disk_offset, unit.incoming.data_ptr(), unit.floats() * static_cast<int64_t>(sizeof(float)));
}

void AdamW8bit::page_in(size_t i) const {
  UnitState& unit = units_[i];
  if (!disk_ || unit.memory.defined()) return;
  read_ahead(i);  // nothing when it is on its way already
  if (const auto arriving = std::exchange(unit.arriving, {}); arriving.valid()) wait_for_disk(arriving);
  unit.bind(std::exchange(unit.incoming, at::Tensor()));
  unit.changed = false;
}

void AdamW8bit::wait_for_disk(const std::shared_future<void>& transfer) const {
  const auto began = std::chrono::steady_clock::now();
  transfer.get();  // rethrows the store's error (file, offset, errno)
  disk_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
}

void AdamW8bit::page_out(size_t i) const {
  UnitState& unit = units_[i];
  if (!disk_ || !unit.memory.defined()) return;
  if (unit.changed && unit.floats() > 0)
    wait_for_disk(disk_->write(unit.disk_offset, unit.memory.data_ptr(), unit.floats() * static_cast<int64_t>(sizeof(float))));
  // Views handed out before keep their bytes (they hold the buffer); the unit lets go of it.
  for (int m = 0; m < 2; ++m) unit.codes[m] = unit.absmax[m] = unit.small[m] = at::Tensor();
  unit.memory = at::Tensor();
  unit.changed = false;
}

void AdamW8bit::keep_resident(size_t i, bool changing) const {
  if (i >= units_.size()) fail("AdamW8bit: unit ", i, " of ", units_.size());
  if (!disk_) return;
  if (held_ != i) {
    release();
    page_in(i);
    held_ = i;
  }
  units_[i].changed = units_[i].changed || changing;
}

void AdamW8bit::release() const {
  if (held_) page_out(*held_);
  held_.reset();
}

void AdamW8bit::update_32bit(size_t i, const Span& span, double lr) {
  const auto& o = options_.adamw;
  const int64_t n = span.end - span.begin;
  at::Tensor p = params_[i].narrow(0, span.param.shard_offset, n), g = grads_[i].narrow(0, span.param.shard_offset, n);
  at::Tensor m = units_[i].small[0].narrow(0, span.small_at, n), v = units_[i].small[1].narrow(0, span.small_at, n);
  m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  const double correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step_count_));
  const double correction2 = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(step_count_)));
  const double step_size = -lr * correction2 / correction1;
  if (o.weight_decay > 0.0) p.mul_(1.0 - lr * o.weight_decay);
  p.add_(m / (v.sqrt() + o.eps * correction2), step_size);
}

void AdamW8bit::update_8bit(size_t i, size_t s, double lr, std::vector<float>& exchange,
                            std::vector<PendingBlock>& pending) {
  const auto& o = options_.adamw;
  UnitState& unit = units_[i];
  const Span& span = unit.spans[s];
  const double correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step_count_));
  const double correction2 = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(step_count_)));
  // Flat-shard position of element e of the param.
  auto at_shard = [&](int64_t e) { return span.param.shard_offset + (e - span.begin); };
  uint8_t* codes[2] = {unit.codes[0].data_ptr<uint8_t>(), unit.codes[1].data_ptr<uint8_t>()};
  float* absmax[2] = {unit.absmax[0].data_ptr<float>() + span.absmax_at - span.first_block,
                      unit.absmax[1].data_ptr<float>() + span.absmax_at - span.first_block};  // by block index
  std::mutex pending_mutex;
  const int64_t first_chunk = span.begin / kChunk, chunks = (span.end - 1) / kChunk - first_chunk + 1;
  at::parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      const int64_t lo = std::max(span.begin, (first_chunk + c) * kChunk);
      const int64_t hi = std::min(span.end, (first_chunk + c + 1) * kChunk);
      const int64_t n = hi - lo;
      at::Tensor moments[2] = {at::empty({n}, at::kFloat), at::empty({n}, at::kFloat)};
      float* values[2] = {moments[0].data_ptr<float>(), moments[1].data_ptr<float>()};
      const int64_t block_lo = lo / kBlock, block_hi = (hi - 1) / kBlock + 1;
      auto block_range = [&](int64_t k) { return std::pair{std::max(lo, k * kBlock), std::min(hi, (k + 1) * kBlock)}; };
      for (int64_t k = block_lo; k < block_hi; ++k) {
        const auto [a, b] = block_range(k);
        for (int m = 0; m < 2; ++m)
          quant::dequantize_block(codes[m] + at_shard(a), b - a, absmax[m][k], map_of(m), values[m] + (a - lo));
      }
      at::Tensor p = params_[i].narrow(0, at_shard(lo), n), g = grads_[i].narrow(0, at_shard(lo), n);
      at::Tensor& m = moments[0];
      at::Tensor& v = moments[1];
      m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
      v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
      const at::Tensor denom = (v.sqrt() / correction2).add_(o.eps);
      if (o.weight_decay > 0.0) p.mul_(1.0 - lr * o.weight_decay);
      p.addcdiv_(m, denom, -lr / correction1);
      for (int64_t k = block_lo; k < block_hi; ++k) {
        const auto [a, b] = block_range(k);
        const auto shared = std::find_if(span.shared.begin(), span.shared.end(), [k](const auto& s) { return s.first == k; });
        if (shared == span.shared.end()) {
          for (int mo = 0; mo < 2; ++mo) {
            absmax[mo][k] = quant::block_absmax(values[mo] + (a - lo), b - a);
            quant::quantize_block(values[mo] + (a - lo), b - a, absmax[mo][k], map_of(mo), codes[mo] + at_shard(a));
          }
          continue;
        }
        PendingBlock held{i, s, k, shared->second, a, b, {}};
        for (int mo = 0; mo < 2; ++mo) {
          exchange[2 * shared->second + mo] = quant::block_absmax(values[mo] + (a - lo), b - a);
          held.values[mo].assign(values[mo] + (a - lo), values[mo] + (b - lo));
        }
        std::lock_guard<std::mutex> lock(pending_mutex);
        pending.push_back(std::move(held));
      }
    }
  });
}

void AdamW8bit::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_count_;
  paged_non_finite_.reset();
  std::vector<float> exchange(2 * exchange_slots_, 0.0f);  // (absmax of exp_avg, of exp_avg_sq) per straddling block
  std::vector<PendingBlock> pending;
  release();  // a checkpoint's unit
  auto trains = [this](size_t i) { return !units_[i].spans.empty(); };  // else a unit of frozen params only
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!trains(i)) continue;
    if (before_update_) before_update_(i);
    page_in(i);
    for (size_t next = i + 1; next < units_.size(); ++next)
      if (trains(next)) {
        read_ahead(next);
        break;
      }
    for (size_t s = 0; s < units_[i].spans.size(); ++s) {
      const Span& span = units_[i].spans[s];
      if (span.end == span.begin) continue;  // no rows of it here
      if (span.eight_bit)
        update_8bit(i, s, lr, exchange, pending);
      else
        update_32bit(i, span, lr);
    }
    if (disk_) {
      settle(pending, exchange, units_[i].slot_begin, units_[i].slot_end);
      units_[i].changed = true;
      page_out(i);
    }
    if (after_update_) {
      check_paged(i, 0, params_[i]);
      after_update_(i);
    }
  }
  if (!disk_) settle(pending, exchange, 0, exchange_slots_);
}

void AdamW8bit::settle(std::vector<PendingBlock>& pending, std::vector<float>& exchange, int64_t slot_begin,
                       int64_t slot_end) {
  if (slot_end == slot_begin) return;  // the same on every rank: no collective to miss
  at::Tensor reduced =
      at::from_blob(exchange.data() + 2 * slot_begin, {2 * (slot_end - slot_begin)}, at::kFloat).clone();
  all_reduce_max_(reduced);
  const float* absmax_of = reduced.data_ptr<float>();
  for (PendingBlock& held : pending) {
    UnitState& unit = units_[held.unit];
    const Span& span = unit.spans[held.span];
    for (int m = 0; m < 2; ++m) {
      const float absmax = absmax_of[2 * (held.slot - slot_begin) + m];
      unit.absmax[m].data_ptr<float>()[span.absmax_at + held.block - span.first_block] = absmax;
      quant::quantize_block(held.values[m].data(), held.end - held.begin, absmax, map_of(m),
                            unit.codes[m].data_ptr<uint8_t>() + span.param.shard_offset + (held.begin - span.begin));
    }
  }
  pending.clear();
}

int64_t AdamW8bit::state_bytes() const {
  return disk_ ? 2 * largest_unit_state_bytes() : total_state_bytes();
}

int64_t AdamW8bit::total_state_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : units_) bytes += unit.bytes();
  return bytes;
}

int64_t AdamW8bit::largest_unit_state_bytes() const {
  int64_t largest = 0;
  for (const auto& unit : units_) largest = std::max(largest, unit.bytes());
  return largest;
}

int64_t AdamW8bit::state_bytes_for(int64_t shard_numel, const std::vector<ShardedParamSpan>& spans, int rank,
                                   int64_t min_8bit_size) {
  int64_t bytes = 2 * shard_numel;
  for (const auto& span : spans) {
    const int64_t begin = span.rank_begins.at(rank), end = span.rank_begins.at(rank + 1);
    if (end == begin) continue;
    bytes += span.numel >= min_8bit_size ? 2 * 4 * ((end - 1) / kBlock - begin / kBlock + 1) : 2 * 4 * (end - begin);
  }
  return bytes;
}

const AdamW8bit::Span& AdamW8bit::find(size_t i, const std::string& name) const {
  if (i >= units_.size()) fail("AdamW8bit: unit ", i, " of ", units_.size());
  for (const auto& span : units_[i].spans)
    if (span.param.name == name) return span;
  fail("AdamW8bit: unit ", i, " trains no param '", name, "'");
}

const AdamW8bit::Span& AdamW8bit::find_resident(size_t i, const std::string& name) const {
  const Span& span = find(i, name);
  if (!units_[i].memory.defined())
    fail("AdamW8bit: unit ", i, "'s state is on disk (training.offload_dir); keep_resident(", i, ") brings it in");
  return span;
}

bool AdamW8bit::is_8bit(size_t i, const std::string& name) const { return find(i, name).eight_bit; }

at::Tensor AdamW8bit::codes(size_t i, const std::string& name, int moment) const {
  const Span& span = find_resident(i, name);
  if (!span.eight_bit) fail("AdamW8bit: '", name, "' keeps fp32 moments (", span.param.numel, " < min_8bit_size)");
  return units_[i].codes[moment].narrow(0, span.param.shard_offset, span.end - span.begin);
}

at::Tensor AdamW8bit::absmax(size_t i, const std::string& name, int moment) const {
  const Span& span = find_resident(i, name);
  if (!span.eight_bit) fail("AdamW8bit: '", name, "' keeps fp32 moments (", span.param.numel, " < min_8bit_size)");
  return units_[i].absmax[moment].narrow(0, span.absmax_at, span.blocks);
}

int64_t AdamW8bit::first_block(size_t i, const std::string& name) const { return find(i, name).first_block; }

std::pair<int64_t, int64_t> AdamW8bit::owned_blocks(size_t i, const std::string& name) const {
  const Span& span = find(i, name);
  return {blocks_of(span.begin), blocks_of(span.end)};  // the blocks that start in [begin, end)
}

at::Tensor AdamW8bit::moment(size_t i, const std::string& name, int moment) const {
  const Span& span = find_resident(i, name);
  if (span.eight_bit) fail("AdamW8bit: '", name, "' keeps 8-bit moments");
  return units_[i].small[moment].narrow(0, span.small_at, span.end - span.begin);
}

}  // namespace mmtrain
