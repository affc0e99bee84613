#include "io/direct_io.h"

#include <fcntl.h>

namespace mmtrain {

int open_direct_when_supported(const std::string& path, int flags, mode_t mode, bool* direct) {
  int fd = ::open(path.c_str(), flags | O_DIRECT, mode);
  *direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), flags, mode);
  return fd;
}

}  // namespace mmtrain
