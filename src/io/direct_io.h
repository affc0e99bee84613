// O_DIRECT files: large sequential writes and reads (checkpoint shards, the offload tier's file)
// that skip the page cache, with the buffered fallback where the filesystem refuses O_DIRECT.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <string>

namespace mmtrain {

// O_DIRECT transfers need offsets, lengths and buffer addresses aligned to the device's logical
// block (512 or 4096 bytes); 4096 covers both.
constexpr int64_t kDirectIoAlign = 4096;

// open(path, flags | O_DIRECT, mode), or, where that fails (tmpfs and some network filesystems
// refuse O_DIRECT), open(path, flags, mode). *direct says whether O_DIRECT took; -1 with errno set
// as by open(2) when neither open succeeded.
int open_direct_when_supported(const std::string& path, int flags, mode_t mode, bool* direct);

}  // namespace mmtrain
