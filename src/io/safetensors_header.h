// The JSON header of a safetensors file, parsed as it streams by (nlohmann's SAX interface), never
// as a DOM: a header costs about its own size in memory, where a DOM costs ~30 bytes per header
// byte (a 96 MB hostile header once took 2.8 GB). A reader refuses a header over
// kMaxSafetensorsHeaderBytes before it allocates it (SafetensorsFile), as the reference (Rust)
// reader does. Only the shape of the header is checked here (an object of
// {"dtype": string, "shape": [uint...], "data_offsets": [uint, uint]} entries and a
// "__metadata__" object of strings); SafetensorsFile checks what the values mean.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mmtrain {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsHeaderEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0, data_end = 0;
};

// Calls on_entry with each tensor's entry as soon as its object closes, in header order (nothing
// is collected here: the caller keeps what it needs), and returns "__metadata__". Fails naming
// `where` (and the tensor) on anything but a header of the shape above: invalid JSON, a missing
// or mistyped field, a negative or non-integer dimension. Duplicate names are the caller's to find.
std::map<std::string, std::string> safetensors_header_parse(const std::string& text, const std::string& where,
                                                            const std::function<void(SafetensorsHeaderEntry&&)>& on_entry);

}  // namespace mmtrain
