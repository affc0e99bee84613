// CRC-32C (Castagnoli, the iSCSI / ext4 / Parquet checksum): what mmtrain's checkpoints record for
// every shard they write, so that a flipped bit is found on load instead of trained on.
// crc32c("123456789") = 0xe3069283. Uses the SSE4.2 crc32 instruction where the CPU has it (about
// 10 GB/s per core), a table otherwise; both give the same value.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mmtrain {

// The CRC of data[0, size), continuing from crc (0 to start; pass the previous result to extend).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// The same through the table, whatever the CPU has (what crc32c is tested against).
uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc = 0);
// "e3069283": how checkpoints write it.
std::string crc32c_hex(uint32_t crc);

}  // namespace mmtrain
