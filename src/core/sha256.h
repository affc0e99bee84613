// SHA-256 (FIPS 180-4), streamed: a base's fingerprint (train/hf_weights.h) must be a hash a
// substituted file cannot be made to match, which a CRC is not (a CRC is linear: appending four
// chosen bytes gives any value).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mmtrain {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  // The digest as 64 lowercase hex digits; the object is spent after it.
  std::string hex();

 private:
  void block(const uint8_t* chunk);  // one 64-byte block into state_
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace mmtrain
