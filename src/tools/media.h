// The media room's commands (python/mmtrain_media, docs/prepare.md): what MagiHuman's encoders and
// decoders need runs in Python on the ecosystem's libraries (PyAV, diffusers, transformers); this
// side parses and checks the flags, then hands the process over to the room's module.
//   prepare magihuman --input SRC --out DIR --vae DIR --audio-vae DIR --text-encoder DIR ...
//   prepare magihuman --decode --input PRECOMPUTED_DIR --out DIR --vae DIR --audio-vae DIR
//   fixture magihuman-encoders --out DIR [--config YAML]
//   fixture clips --out DIR [--count N] [--seconds S] [--size HxW]
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

// "HxW" -> {H, W}; both must be positive multiples of `multiple`, else fails naming `flag`.
std::pair<int64_t, int64_t> parse_resolution(const std::string& text, int64_t multiple, const std::string& flag);

// The directory holding the room's package mmtrain_media: share/mmtrain/python beside the binary,
// or $MMTRAIN_MEDIA_PATH.
std::string media_path();

// Replaces this process with `<tools python> -m mmtrain_media.<module> args...`, the room found
// beside the binary (share/mmtrain/python) or at $MMTRAIN_MEDIA_PATH. Never returns.
[[noreturn]] void exec_media_module(const std::string& module, const std::vector<std::string>& args);

}  // namespace mmtrain
