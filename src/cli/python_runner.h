// The media room (python/mmtrain_media, docs/prepare.md) seen from C++: what MagiHuman's encoders
// and decoders need runs in Python on the ecosystem's libraries (PyAV, diffusers, transformers);
// the commands here check their flags, then run the room's modules.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

// The directory holding the room's package mmtrain_media: share/mmtrain/python beside the binary,
// or $MMTRAIN_MEDIA_PATH.
std::string media_path();

// "HxW" -> {H, W}; both must be positive multiples of `multiple`, else fails naming `flag`.
std::pair<int64_t, int64_t> parse_resolution(const std::string& text, int64_t multiple, const std::string& flag);

// An output must be new (nothing is ever overwritten): fails naming `flag` when anything, a link
// included, is at `path`; `hint` ends the message.
void require_new_path(const std::string& path, const std::string& flag, const std::string& hint = "");

// A double written so that parsing it gives the same double back (%.17g), for a module's flags.
std::string argument_number(double value);

// Replaces this process with `<tools python> -m mmtrain_media.<module> args...`. Never returns.
[[noreturn]] void exec_media_module(const std::string& module, const std::vector<std::string>& args);

// Runs `<tools python> -m mmtrain_media.<module> args...` and waits; its output goes to `log`
// (removed after). Fails naming `what` with what it printed when it fails (tools/plots.h).
void run_media_module(const std::string& module, const std::vector<std::string>& args, const std::string& log,
                      const std::string& what);

}  // namespace mmtrain
