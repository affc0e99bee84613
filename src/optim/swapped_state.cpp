#include "optim/swapped_state.h"

#include "core/error.h"

#include <algorithm>
#include <chrono>

namespace mmtrain {

SwappedState::SwappedState(std::shared_ptr<TierStore> store, const std::vector<int64_t>& numels, int tensors_per_param,
                           int64_t chunk_numel)
    : store_(std::move(store)), tensors_per_param_(tensors_per_param), chunk_numel_(chunk_numel) {
  // Whole blocks per chunk, so every chunk's offset in a region stays block-aligned.
  constexpr int64_t per_block = kFloatsPerBlock;
  if (chunk_numel_ < per_block || chunk_numel_ % per_block != 0)
    fail("SwappedState: chunk_numel must be a positive multiple of ", per_block, ", got ", chunk_numel_);
  if (tensors_per_param_ < 1) fail("SwappedState: tensors_per_param must be >= 1, got ", tensors_per_param_);
  for (int64_t numel : numels) {
    Region region{numel, {}};
    for (int t = 0; t < tensors_per_param_; ++t)
      region.offsets.push_back(store_->reserve(numel * static_cast<int64_t>(sizeof(float))));
    regions_.push_back(std::move(region));
  }
  for (auto& window : windows_) {
    for (int t = 0; t < tensors_per_param_; ++t) window.buffers.push_back(store_->window(chunk_numel_));
    window.reads.resize(tensors_per_param_);
    window.writes.resize(tensors_per_param_);
  }
}

int64_t SwappedState::chunk_numel_for(double mem_fraction_static, std::optional<int64_t> free_bytes,
                                      int64_t largest_numel, int tensors_per_param) {
  constexpr int64_t per_block = kFloatsPerBlock;
  int64_t numel = std::min(kMaxChunkNumel, (largest_numel + per_block - 1) / per_block * per_block);
  if (free_bytes) {
    const double budget = mem_fraction_static * static_cast<double>(*free_bytes);
    numel = std::min<int64_t>(numel, static_cast<int64_t>(budget / static_cast<double>(window_bytes_for(1, tensors_per_param))));
  }
  return std::max(per_block, numel / per_block * per_block);
}

void SwappedState::wait(std::shared_future<void>& transfer) {
  if (!transfer.valid()) return;
  const auto began = std::chrono::steady_clock::now();
  transfer.get();  // rethrows the store's error
  wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  transfer = {};
}

void SwappedState::start_read(const Chunk& chunk, Window& window) {
  // The window's previous chunk must be out before the buffers are reused.
  for (auto& write : window.writes) wait(write);
  const Region& region = regions_[chunk.param];
  const int64_t at = chunk.begin * static_cast<int64_t>(sizeof(float));
  for (int t = 0; t < tensors_per_param_; ++t)
    window.reads[t] = store_->read(region.offsets[t] + at, window.buffers[t].narrow(0, 0, chunk.numel));
}

void SwappedState::stream(const std::vector<size_t>& params, const Update& update) {
  std::vector<Chunk> chunks;
  for (size_t param : params)
    for (int64_t begin = 0; begin < regions_.at(param).numel; begin += chunk_numel_)
      chunks.push_back({param, begin, std::min(chunk_numel_, regions_[param].numel - begin)});
  if (chunks.empty()) return;

  // On an error every queued transfer still runs to its end before the buffers may go.
  auto drain = [this] {
    for (auto& w : windows_)
      for (auto* transfers : {&w.reads, &w.writes})
        for (auto& t : *transfers)
          if (t.valid()) t.wait(), t = {};
  };
  try {
    start_read(chunks[0], windows_[0]);
    std::vector<at::Tensor> chunk_tensors(tensors_per_param_);
    for (size_t k = 0; k < chunks.size(); ++k) {
      if (k + 1 < chunks.size()) start_read(chunks[k + 1], windows_[(k + 1) % windows_.size()]);
      Window& window = windows_[k % windows_.size()];
      for (auto& read : window.reads) wait(read);
      const Chunk& chunk = chunks[k];
      for (int t = 0; t < tensors_per_param_; ++t) chunk_tensors[t] = window.buffers[t].narrow(0, 0, chunk.numel);
      update(chunk.param, chunk.begin, chunk_tensors);
      const Region& region = regions_[chunk.param];
      const int64_t at = chunk.begin * static_cast<int64_t>(sizeof(float));
      for (int t = 0; t < tensors_per_param_; ++t) window.writes[t] = store_->write(region.offsets[t] + at, chunk_tensors[t]);
    }
    for (auto& w : windows_)
      for (auto& write : w.writes) wait(write);
  } catch (...) {
    drain();
    throw;
  }
}

at::Tensor SwappedState::read(size_t param, int t) const {
  const Region& region = regions_.at(param);
  return store_->read_to_host(region.offsets.at(t), region.numel);
}

at::Tensor SwappedState::read_range(size_t param, int t, int64_t begin, int64_t numel) const {
  const Region& region = regions_.at(param);
  if (begin < 0 || numel < 0 || begin + numel > region.numel)
    fail("SwappedState: elements [", begin, ", ", begin + numel, ") of a param of ", region.numel);
  // Regions start on a block and transfers move whole blocks: read from the block holding begin.
  const int64_t lead = begin % kFloatsPerBlock;
  const int64_t offset = region.offsets.at(t) + (begin - lead) * static_cast<int64_t>(sizeof(float));
  return store_->read_to_host(offset, lead + numel).narrow(0, lead, numel);
}

void SwappedState::write(size_t param, int t, const at::Tensor& values) {
  store_->write_from(regions_.at(param).offsets.at(t), values);
}

}  // namespace mmtrain
