#include "optim/swapped_moments.h"

#include "core/error.h"

#include <algorithm>
#include <chrono>

namespace mmtrain {
SwappedMoments::SwappedMoments(std::shared_ptr<TierStore> store, const std::vector<int64_t>& numels, int64_t chunk_numel)
    : store_(std::move(store)), chunk_numel_(chunk_numel) {
  // Whole blocks per chunk, so every chunk's offset in a region stays block-aligned.
  constexpr int64_t per_block = kFloatsPerBlock;
  if (chunk_numel_ < per_block || chunk_numel_ % per_block != 0)
    fail("SwappedMoments: chunk_numel must be a positive multiple of ", per_block, ", got ", chunk_numel_);
  for (int64_t numel : numels) {
    const int64_t bytes = numel * static_cast<int64_t>(sizeof(float));
    regions_.push_back({numel, store_->reserve(bytes), store_->reserve(bytes)});
  }
  for (auto& window : windows_) {
    window.exp_avg = store_->window(chunk_numel_);
    window.exp_avg_sq = store_->window(chunk_numel_);
  }
}

int64_t SwappedMoments::chunk_numel_for(double mem_fraction_static, std::optional<int64_t> free_bytes,
                                     int64_t largest_numel) {
  constexpr int64_t per_block = kFloatsPerBlock;
  int64_t numel = std::min(kMaxChunkNumel, (largest_numel + per_block - 1) / per_block * per_block);
  if (free_bytes) {
    const double budget = mem_fraction_static * static_cast<double>(*free_bytes);
    numel = std::min<int64_t>(numel, static_cast<int64_t>(budget / (3 * 2 * sizeof(float))));
  }
  return std::max(per_block, numel / per_block * per_block);
}

void SwappedMoments::wait(std::shared_future<void>& transfer) {
  if (!transfer.valid()) return;
  const auto began = std::chrono::steady_clock::now();
  transfer.get();  // rethrows the store's error
  wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  transfer = {};
}

void SwappedMoments::start_read(const Chunk& chunk, Window& window) {
  // The window's previous chunk must be on disk before the buffers are reused.
  wait(window.write_avg);
  wait(window.write_avg_sq);
  const Region& region = regions_[chunk.param];
  const int64_t at = chunk.begin * static_cast<int64_t>(sizeof(float));
  window.read_avg = store_->read(region.exp_avg + at, window.exp_avg.narrow(0, 0, chunk.numel));
  window.read_avg_sq = store_->read(region.exp_avg_sq + at, window.exp_avg_sq.narrow(0, 0, chunk.numel));
}

void SwappedMoments::stream(const std::vector<size_t>& params, const Update& update) {
  std::vector<Chunk> chunks;
  for (size_t param : params)
    for (int64_t begin = 0; begin < regions_.at(param).numel; begin += chunk_numel_)
      chunks.push_back({param, begin, std::min(chunk_numel_, regions_[param].numel - begin)});
  if (chunks.empty()) return;

  // On an error every queued transfer still runs to its end before the buffers may go.
  auto drain = [this] {
    for (auto& w : windows_)
      for (auto* t : {&w.read_avg, &w.read_avg_sq, &w.write_avg, &w.write_avg_sq})
        if (t->valid()) t->wait(), *t = {};
  };
  try {
    start_read(chunks[0], windows_[0]);
    for (size_t k = 0; k < chunks.size(); ++k) {
      if (k + 1 < chunks.size()) start_read(chunks[k + 1], windows_[(k + 1) % windows_.size()]);
      Window& window = windows_[k % windows_.size()];
      wait(window.read_avg);
      wait(window.read_avg_sq);
      const Chunk& chunk = chunks[k];
      at::Tensor exp_avg = window.exp_avg.narrow(0, 0, chunk.numel);
      at::Tensor exp_avg_sq = window.exp_avg_sq.narrow(0, 0, chunk.numel);
      update(chunk.param, chunk.begin, exp_avg, exp_avg_sq);
      const Region& region = regions_[chunk.param];
      const int64_t at = chunk.begin * static_cast<int64_t>(sizeof(float));
      window.write_avg = store_->write(region.exp_avg + at, exp_avg);
      window.write_avg_sq = store_->write(region.exp_avg_sq + at, exp_avg_sq);
    }
    for (auto& w : windows_) {
      wait(w.write_avg);
      wait(w.write_avg_sq);
    }
  } catch (...) {
    drain();
    throw;
  }
}

std::pair<at::Tensor, at::Tensor> SwappedMoments::read(size_t param) const {
  const Region& region = regions_.at(param);
  return {store_->read_to_host(region.exp_avg, region.numel), store_->read_to_host(region.exp_avg_sq, region.numel)};
}

at::Tensor SwappedMoments::read_range(size_t param, bool exp_avg_sq, int64_t begin, int64_t numel) const {
  const Region& region = regions_.at(param);
  if (begin < 0 || numel < 0 || begin + numel > region.numel)
    fail("SwappedMoments: elements [", begin, ", ", begin + numel, ") of a param of ", region.numel);
  // Regions start on a block and transfers move whole blocks: read from the block holding begin.
  const int64_t lead = begin % kFloatsPerBlock;
  const int64_t offset = (exp_avg_sq ? region.exp_avg_sq : region.exp_avg) +
                         (begin - lead) * static_cast<int64_t>(sizeof(float));
  return store_->read_to_host(offset, lead + numel).narrow(0, lead, numel);
}

void SwappedMoments::write(size_t param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  const Region& region = regions_.at(param);
  store_->write_from(region.exp_avg, exp_avg);
  store_->write_from(region.exp_avg_sq, exp_avg_sq);
}

}  // namespace mmtrain
