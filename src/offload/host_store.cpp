#include "offload/host_store.h"

#include "core/error.h"

namespace mmtrain {
namespace {

constexpr int64_t kFloat = static_cast<int64_t>(sizeof(float));

// A transfer's future: ready once the copy's event is (a deferred wait, run by the first get()).
std::shared_future<void> future_of(CopyEvent event) {
  return std::async(std::launch::deferred, [event]() mutable { event.wait(); }).share();
}

}  // namespace

HostStore::HostStore(std::shared_ptr<HostPool> pool, std::shared_ptr<CopyStream> copies)
    : pool_(std::move(pool)), copies_(std::move(copies)) {}

at::Tensor HostStore::window(int64_t numel) {
  return at::zeros({numel}, at::TensorOptions().dtype(at::kFloat).device(copies_->device()));
}

int64_t HostStore::reserve(int64_t bytes) {
  if (bytes % kFloat != 0) fail("HostStore: regions hold fp32 elements, got ", bytes, " bytes");
  const int64_t offset = end_;
  if (bytes == 0) return offset;  // nothing to hold; reads and writes of it move nothing
  regions_[offset] = pool_->take_zeros({bytes / kFloat}, at::kFloat);
  end_ += bytes;
  return offset;
}

at::Tensor HostStore::region_slice(int64_t offset, int64_t numel) const {
  auto it = regions_.upper_bound(offset);
  if (it == regions_.begin()) fail("HostStore: offset ", offset, " is in no region");
  --it;
  const int64_t begin = (offset - it->first) / kFloat;
  if (begin + numel > it->second.numel())
    fail("HostStore: ", numel, " elements at offset ", offset, " run past their region");
  return it->second.narrow(0, begin, numel);
}

std::shared_future<void> HostStore::read(int64_t offset, at::Tensor chunk) {
  if (chunk.numel() == 0) return future_of({});
  return future_of(copies_->to_device(chunk, region_slice(offset, chunk.numel())));
}

std::shared_future<void> HostStore::write(int64_t offset, const at::Tensor& chunk) {
  if (chunk.numel() == 0) return future_of({});
  return future_of(copies_->to_host(region_slice(offset, chunk.numel()), chunk));
}

at::Tensor HostStore::read_to_host(int64_t offset, int64_t numel) {
  if (numel == 0) return at::empty({0}, at::kFloat);
  return region_slice(offset, numel);
}

void HostStore::write_from(int64_t offset, const at::Tensor& values) {
  if (values.numel() == 0) return;
  region_slice(offset, values.numel()).copy_(values.reshape(-1));
}

std::string HostStore::describe() const {
  return std::string("in ") + (pool_->pinned() ? "pinned " : "") + "host memory";
}

}  // namespace mmtrain
