// A bound on Python pickles before LibTorch unpickles them. LibTorch's unpickler builds and later
// destroys nested lists recursively, so a .pt sample whose pickle nests 300k lists overflowed the
// stack (SIGSEGV) in the list destructor. The number of containers a pickle creates bounds how
// deep it can nest, and a torch.save'd dict of tensors creates a handful: walking the opcodes
// (skipping their arguments, without building anything) and refusing more than
// kMaxPickleContainers containers, or an opcode torch.save does not write, keeps that input out.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mmtrain {

constexpr int64_t kMaxPickleContainers = 10000;

struct PickleScan {
  int64_t containers = 0;  // lists, dicts and tuples the pickle would create
  int64_t opcodes = 0;
};

// Scans a pickle (protocols 0-5's binary opcodes, as torch.save writes them); source names it in
// errors. Fails for a truncated pickle, an opcode outside that set, or too many containers.
PickleScan scan_pickle(const char* data, size_t size, const std::string& source);

}  // namespace mmtrain
