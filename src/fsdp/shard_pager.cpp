#include "fsdp/shard_pager.h"

#include "core/error.h"

#include <ATen/record_function.h>

#include <chrono>
#include <utility>

namespace mmtrain {
namespace {

int64_t shard_bytes(const FsdpUnit& unit) { return unit.shard_flat.numel() * static_cast<int64_t>(sizeof(float)); }

c10::StorageImpl& storage_of(const FsdpUnit& unit) { return *unit.shard_flat.storage().unsafeGetStorageImpl(); }

}  // namespace

ShardPager::ShardPager(std::shared_ptr<OffloadTiers> tiers, const std::vector<FsdpUnit*>& units)
    : tiers_(std::move(tiers)) {
  for (auto* unit : units) {
    if (unit->shard_flat.storage_offset() != 0)
      fail("ShardPager: unit '", unit->name, "' shard does not start its storage");
    pages_.push_back({unit, tiers_->disk->reserve(shard_bytes(*unit))});
  }
}

ShardPager::~ShardPager() {
  for (auto& page : pages_)
    if (page.arriving.valid()) page.arriving.wait();  // the I/O thread writes into page.incoming
}

void ShardPager::wait(const std::shared_future<void>& transfer) {
  const auto began = std::chrono::steady_clock::now();
  transfer.get();  // rethrows the store's error (file, offset, errno)
  tiers_->stats->disk_wait_us +=
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - began).count();
}

ShardPager::Page& ShardPager::page_of(const FsdpUnit& unit) { return pages_.at(unit.order); }
const ShardPager::Page& ShardPager::page_of(const FsdpUnit& unit) const { return pages_.at(unit.order); }

bool ShardPager::resident(const FsdpUnit& unit) const { return page_of(unit).resident; }

void ShardPager::read_ahead(FsdpUnit& unit) {
  Page& page = page_of(unit);
  if (page.resident || page.incoming.defined()) return;
  // A pool buffer (page-aligned, whole pages: what direct I/O needs) becomes the storage's memory.
  page.incoming = tiers_->host_pool->take({unit.shard_flat.numel()}, at::kFloat);
  if (const int64_t bytes = shard_bytes(unit); bytes > 0)
    page.arriving = tiers_->disk->read(page.offset, page.incoming.data_ptr(), bytes);
}

void ShardPager::page_in(FsdpUnit& unit) {
  Page& page = page_of(unit);
  if (page.resident) return;
  RECORD_USER_SCOPE("offload::shard_from_disk");
  read_ahead(unit);  // nothing when it is on its way already
  const at::Tensor buffer = std::exchange(page.incoming, at::Tensor());
  if (const auto arriving = std::exchange(page.arriving, {}); arriving.valid()) wait(arriving);
  auto& storage = storage_of(unit);
  storage.set_data_ptr_noswap(buffer.storage().unsafeGetStorageImpl()->set_data_ptr(at::DataPtr(nullptr, at::kCPU)));
  storage.set_nbytes(static_cast<size_t>(shard_bytes(unit)));
  page.resident = true;
}

void ShardPager::page_in_reading_next(FsdpUnit& unit) {
  page_in(unit);
  if (unit.order + 1 < pages_.size()) read_ahead(*pages_[unit.order + 1].unit);
}

void ShardPager::page_out(FsdpUnit& unit, bool changed) {
  Page& page = page_of(unit);
  if (!page.resident) return;
  RECORD_USER_SCOPE("offload::shard_to_disk");
  const int64_t bytes = shard_bytes(unit);
  if (changed && bytes > 0) wait(tiers_->disk->write(page.offset, unit.shard_flat.data_ptr(), bytes));
  auto& storage = storage_of(unit);
  storage.set_data_ptr_noswap(at::DataPtr(nullptr, at::kCPU));  // the pool gets the buffer back
  storage.set_nbytes(0);
  page.resident = false;
}

void ShardPager::page_out_all(bool changed) {
  for (auto& page : pages_) page_out(*page.unit, changed);
  tiers_->host_pool->trim();  // every shard was in RAM at once (construction): those buffers go back
}

}  // namespace mmtrain
