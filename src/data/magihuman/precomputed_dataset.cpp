// `magihuman_precomputed`: one sample per stem, read from three sibling directories only when
// get() asks for it. The constructor lists the directories and checks every stem exists in all
// three; shapes are checked per sample on read, each error naming the file.
#include "data/magihuman/precomputed_dataset.h"

#include "core/checked_math.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/param_map.h"
#include "core/pickle_scan.h"
#include "core/regular_file.h"
#include "core/suggest.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/user_file.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <tuple>

namespace mmtrain::magihuman {
namespace fs = std::filesystem;

namespace {

const char* const kSubdirs[] = {"latents", "audio_latents", "conditions"};
// The names each tensor is found under in its file, the first present wins.
const std::vector<std::string> kVideoKeys = {"video_latent", "latents"};
const std::vector<std::string> kGridKeys = {"video_grid_thw", "grid_thw"};
const std::vector<std::string> kAudioKeys = {"audio_latent", "latents"};
const std::vector<std::string> kTextKeys = {"prompt_embeds", "text_embed"};

std::string where_key(const std::string& key) { return "data.dataset_param." + key; }

PrecomputedDataOptions parse_options(const nlohmann::json& map, bool need_root) {
  const ParamMap p(map, "data.dataset_param", "dataset magihuman_precomputed");
  p.check_known_keys({"dataset_type", "data_root", "basic_parameters", "max_samples", "video_in_channels",
                      "audio_in_channels", "text_in_channels", "sigma_sampling", "logit_normal_loc",
                      "logit_normal_scale"});
  PrecomputedDataOptions o;
  o.data_root = p.get_string("data_root", "");
  o.max_samples = p.get_int("max_samples", 0);
  // MindSpeed-MM's layout: basic_parameters: {dataset_dir, dataset, max_samples}.
  if (p.has("basic_parameters")) {
    const auto basic = p.child("basic_parameters");
    basic.check_known_keys({"dataset_dir", "dataset", "max_samples"});
    const auto dir = basic.get_string("dataset_dir", "");
    if (!dir.empty() && !o.data_root.empty() && dir != o.data_root)
      fail(p.where("data_root"), " '", o.data_root, "' and ", basic.where("dataset_dir"), " '", dir, "' disagree: give one");
    if (!dir.empty()) o.data_root = dir;
    const auto max_samples = basic.get_int("max_samples", 0);
    if (max_samples != 0 && o.max_samples != 0 && max_samples != o.max_samples)
      fail(p.where("max_samples"), " ", o.max_samples, " and ", basic.where("max_samples"), " ", max_samples,
           " disagree: give one");
    if (max_samples != 0) o.max_samples = max_samples;
  }
  if (need_root && o.data_root.empty())
    fail(p.where("data_root"), ": required for dataset_type magihuman_precomputed (the .precomputed directory "
         "holding latents/, audio_latents/, conditions/)");
  if (o.max_samples < 0) fail(p.where("max_samples"), ": expected >= 0 (0 = all), found ", o.max_samples);
  o.video_in_channels = p.get_int("video_in_channels", o.video_in_channels);
  o.audio_in_channels = p.get_int("audio_in_channels", o.audio_in_channels);
  o.text_in_channels = p.get_int("text_in_channels", o.text_in_channels);
  if (o.video_in_channels <= 0 || o.video_in_channels % 4 != 0)
    fail(p.where("video_in_channels"), ": expected latent channels x 4 (1x2x2 patch), a positive multiple of 4, found ",
         o.video_in_channels);
  if (o.audio_in_channels <= 0) fail(p.where("audio_in_channels"), ": expected >= 1, found ", o.audio_in_channels);
  if (o.text_in_channels <= 0) fail(p.where("text_in_channels"), ": expected >= 1, found ", o.text_in_channels);
  const auto sampling = p.get_string("sigma_sampling", "logit_normal");
  if (sampling == "logit_normal")
    o.sigma_sampling = SigmaSampling::kLogitNormal;
  else if (sampling == "uniform")
    o.sigma_sampling = SigmaSampling::kUniform;
  else
    fail(p.where("sigma_sampling"), ": expected logit_normal|uniform, found '", sampling, "'");
  o.logit_normal_loc = p.get_double("logit_normal_loc", 0.0);
  o.logit_normal_scale = p.get_double("logit_normal_scale", 1.0);
  if (!std::isfinite(o.logit_normal_loc)) fail(p.where("logit_normal_loc"), ": expected a finite number");
  if (!(o.logit_normal_scale >= 0.0) || !std::isfinite(o.logit_normal_scale))
    fail(p.where("logit_normal_scale"), ": expected a finite number >= 0, found ", o.logit_normal_scale);
  return o;
}

bool is_safetensors(const fs::path& p) { return p.extension() == ".safetensors"; }
bool is_sample_file(const fs::path& p) { return p.extension() == ".pt" || is_safetensors(p); }

// stem -> full path of every sample file in dir; two files with one stem are an error.
std::map<std::string, std::string> list_dir(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!is_sample_file(entry.path())) continue;
    require_regular_file(entry.path().string(), entry.path().string(), "a sample file");
    const auto stem = entry.path().stem().string();
    const auto [it, inserted] = out.emplace(stem, entry.path().string());
    if (!inserted)
      fail(dir.string(), ": expected one file per sample, found two for stem '", stem, "': ", it->second, " and ",
           entry.path().string());
  }
  return out;
}

std::string read_bytes(const std::string& path) {
  require_regular_file(path, path, "a sample file");  // its messages name what was expected
  return read_user_file(path, path, kMaxDataFileBytes);
}

// A list/tuple of numbers -> 1-D tensor (int64 if every element is an int); else undefined.
at::Tensor list_to_tensor(const std::vector<c10::IValue>& items) {
  bool all_int = true;
  std::vector<double> values;
  for (const auto& item : items) {
    if (item.isInt()) {
      values.push_back(static_cast<double>(item.toInt()));
    } else if (item.isDouble()) {
      values.push_back(item.toDouble());
      all_int = false;
    } else {
      return {};
    }
  }
  auto out = at::tensor(values, at::kDouble);
  return all_int ? out.to(at::kLong) : out;
}

at::Tensor ivalue_to_tensor(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor();
  if (v.isTuple()) return list_to_tensor(v.toTupleRef().elements().vec());
  if (v.isList()) return list_to_tensor(v.toList().vec());
  return {};  // not a tensor: kept as a key (listed in messages), unusable as data
}

const at::Tensor& get_key(const std::map<std::string, at::Tensor>& tensors, const std::vector<std::string>& names,
                          const std::string& path) {
  for (const auto& name : names) {
    const auto found = tensors.find(name);
    if (found == tensors.end()) continue;
    if (!found->second.defined())
      fail(path, ": key '", name, "' must be a tensor (or a list of numbers), found another value");
    return found->second;
  }
  std::string expected = "'" + names[0] + "'";
  for (size_t i = 1; i < names.size(); ++i) expected += " (or '" + names[i] + "')";
  std::vector<std::string> keys;
  for (const auto& [k, _] : tensors) keys.push_back(k);
  fail(path, ": expected key ", expected, ", found keys: ", keys.empty() ? std::string("(none)") : join_names(keys));
}

// [N, width] fp32 (a leading dim of 1 is squeezed: [1, N, width] is accepted).
at::Tensor as_rows(at::Tensor t, int64_t width, const std::string& what, const std::string& width_key,
                   const std::string& path) {
  if (t.dim() == 3 && t.size(0) == 1) t = t.squeeze(0);
  if (t.dim() != 2)
    fail(path, ": ", what, " must be [N, ", width, "] (or [1, N, ", width, "]), found shape ", t.sizes());
  if (!at::isFloatingType(t.scalar_type()))
    fail(path, ": ", what, " must be a floating tensor, found ", t.scalar_type());
  if (t.size(1) != width)
    fail(path, ": ", what, " has ", t.size(1), " channels, expected ", width, " (", where_key(width_key),
         ", which must equal model.config.", width_key, ")");
  auto rows = t.to(at::kFloat).contiguous();
  // A NaN or Inf here would only surface steps later as "grad norm is nan", naming no sample.
  const auto finite_rows = at::isfinite(rows).all(1);
  if (!finite_rows.all().item<bool>()) {
    const int64_t row = (~finite_rows).nonzero()[0][0].item<int64_t>();
    fail(path, ": ", what, " holds NaN or Inf values (first in row ", row, " of ", rows.size(0), ")");
  }
  return rows;
}

}  // namespace

nlohmann::json with_model_channels(const DataConfig& data, const ModelConfig& model) {
  auto p = data.dataset_param;
  for (const char* key : {"video_in_channels", "audio_in_channels", "text_in_channels"})
    if (!p.contains(key) && model.config.contains(key)) p[key] = model.config[key];
  return p;
}

PrecomputedDataOptions PrecomputedDataOptions::from_json(const nlohmann::json& p) { return parse_options(p, true); }
PrecomputedDataOptions PrecomputedDataOptions::from_json_collate(const nlohmann::json& p) {
  return parse_options(p, false);
}

int64_t PrecomputedDataOptions::io_width() const {
  return std::max({video_in_channels, audio_in_channels, text_in_channels});
}
int64_t PrecomputedDataOptions::out_width() const { return std::max(video_in_channels, audio_in_channels); }

std::map<std::string, at::Tensor> read_sample_file(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  if (is_safetensors(path)) {
    SafetensorsFile file(path);
    for (const auto& name : file.names()) out[name] = file.read(name);
    return out;
  }
  const auto bytes = read_bytes(path);
  c10::IValue value;
  try {
    caffe2::serialize::PyTorchStreamReader archive(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
    // The pickle inside the zip is scanned before LibTorch unpickles it (core/pickle_scan.h).
    if (archive.hasRecord("data.pkl")) {
      const auto [pickle, size] = archive.getRecord("data.pkl");
      scan_pickle(static_cast<const char*>(pickle.get()), size, path + ": data.pkl");
    }
    // What torch::jit::pickle_load does, on the archive already open.
    value = torch::jit::readArchiveAndTensors("data", "", "", std::nullopt, std::nullopt, std::nullopt, archive);
  } catch (const c10::Error& e) {
    fail(path, ": expected a file written by Python torch.save (zip format, torch >= 1.6 default) holding a dict "
         "of tensors; it could not be read: ", e.what_without_backtrace());
  }
  if (!value.isGenericDict())
    fail(path, ": expected a dict of tensors (torch.save({...})), found a ", value.tagKind());
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString())
      fail(path, ": expected string keys in the saved dict, found a ", item.key().tagKind(), " key");
    out[item.key().toStringRef()] = ivalue_to_tensor(item.value());
  }
  return out;
}

void write_pt_file(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor.contiguous());
  // torch::jit::pickle_save, except that aggregates are not type-tagged: a tagged dict pickles a
  // call to torch.jit._pickle.restore_type_tag, which torch.load(weights_only=True) refuses.
  std::vector<char> pickle_bytes;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle_bytes.insert(pickle_bytes.end(), data, data + n); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(dict);
  pickler.stop();
  AtomicFile file(path);
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
      file.write(data, n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle_bytes.data(), pickle_bytes.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  }
  file.commit();
}

// `mmtrain prepare magihuman` records the encoders' token widths in prepare.json; data made for
// another model is refused here, before the first step, instead of at the first sample read.
void PrecomputedDataset::check_prepared_widths(const std::filesystem::path& root) const {
  const auto path = (root / "prepare.json").string();
  std::error_code error;
  if (fs::symlink_status(path, error).type() == fs::file_type::not_found) return;
  const auto summary = json_parse_checked(read_user_file(path, "prepare summary", int64_t{64} << 20), path);
  if (!summary.is_object() || !summary.contains("channels")) return;  // not written by prepare: nothing to check
  const auto& channels = summary["channels"];
  const std::pair<const char*, int64_t> widths[] = {{"video", options_.video_in_channels},
                                                    {"audio", options_.audio_in_channels},
                                                    {"text", options_.text_in_channels}};
  for (const auto& [modality, width] : widths) {
    if (!channels.is_object() || !channels.contains(modality) || !channels[modality].is_number_integer())
      fail(path, ": 'channels' must hold integer video, audio and text widths");
    const int64_t prepared = channels[modality].get<int64_t>();
    if (prepared != width)
      fail(path, ": the data was prepared with ", modality, " tokens ", prepared, " wide, the model takes ", width,
           " (model.config.", modality, "_in_channels): prepare it with the encoders of this model");
  }
}

PrecomputedDataset::PrecomputedDataset(PrecomputedDataOptions options) : options_(std::move(options)) {
  const fs::path root(options_.data_root);
  if (!fs::is_directory(root))
    fail(where_key("data_root"), ": '", root.string(), "' is not a directory (expected a .precomputed directory holding ",
         "latents/, audio_latents/, conditions/)");
  std::map<std::string, std::string> files[3];
  for (int i = 0; i < 3; ++i) {
    const auto dir = root / kSubdirs[i];
    if (!fs::is_directory(dir))
      fail(dir.string(), ": missing subdirectory '", kSubdirs[i], "' of data_root (expected latents/, audio_latents/, ",
           "conditions/ with one .pt or .safetensors file per sample)");
    files[i] = list_dir(dir);
  }
  // A sample needs all three modalities: a stem in any directory must be in the others.
  std::set<std::string> stems;
  for (const auto& f : files)
    for (const auto& [stem, _] : f) stems.insert(stem);
  for (const auto& stem : stems) {
    for (int i = 0; i < 3; ++i) {
      if (files[i].count(stem)) continue;
      const int present = files[0].count(stem) ? 0 : files[1].count(stem) ? 1 : 2;
      fail((root / kSubdirs[i]).string(), ": sample '", stem, "' has no file here (expected ", stem,
           ".pt or .safetensors), but ", files[present].at(stem), " exists: every sample needs latents/, ",
           "audio_latents/ and conditions/");
    }
    samples_.push_back({stem, files[0].at(stem), files[1].at(stem), files[2].at(stem)});
  }
  if (samples_.empty()) fail((root / "latents").string(), ": no samples (*.pt or *.safetensors)");
  check_prepared_widths(root);
  if (options_.max_samples > 0 && options_.max_samples < size()) samples_.resize(options_.max_samples);
}

const std::string& PrecomputedDataset::stem(int64_t index) const {
  if (index < 0 || index >= size()) fail("magihuman_precomputed: sample index ", index, " outside 0..", size() - 1);
  return samples_[index].stem;
}

std::string PrecomputedDataset::describe(int64_t index) const {
  stem(index);  // range check
  return samples_[index].latents;
}

namespace {

// The rows of a [N, C] (or [1, N, C]) tensor from a safetensors header alone; nullopt when the file
// does not hold it in that form (get() then reads the sample and names what is wrong).
std::optional<int64_t> header_rows(const std::string& path, const std::vector<std::string>& names) {
  const SafetensorsFile file(path);
  for (const auto& name : names) {
    if (!file.contains(name)) continue;
    auto shape = file.info(name).shape;
    if (shape.size() == 3 && shape[0] == 1) shape.erase(shape.begin());
    return shape.size() == 2 ? std::optional<int64_t>(shape[0]) : std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> PrecomputedDataset::sample_tokens(int64_t index) const {
  stem(index);  // range check
  const auto& s = samples_[index];
  // Safetensors samples: the headers say it without reading the latents (a .pt is read whole).
  if (is_safetensors(s.latents) && is_safetensors(s.audio_latents) && is_safetensors(s.conditions)) {
    const auto video = header_rows(s.latents, kVideoKeys);
    const auto audio = header_rows(s.audio_latents, kAudioKeys);
    const auto text = header_rows(s.conditions, kTextKeys);
    if (video && audio && text) {
      // Header row counts are claims: checked before they are summed (a [2^62, 0] tensor holds no bytes).
      const std::string what = "sample " + s.latents + " (with its audio and text files)";
      const int64_t total = checked_add(checked_add(*video, *audio, what), *text, what);
      return checked_tokens(total, what);
    }
  }
  const Batch sample = get(index);
  return batch_get(sample, "video_latent").size(0) + batch_get(sample, "audio_latent").size(0) +
         batch_get(sample, "text_embed").size(0);
}

Batch PrecomputedDataset::get(int64_t index) const {
  stem(index);  // range check
  const auto& s = samples_[index];
  const auto& o = options_;

  const auto latents = read_sample_file(s.latents);
  auto video = as_rows(get_key(latents, kVideoKeys, s.latents), o.video_in_channels, "video latent",
                       "video_in_channels", s.latents);
  auto grid = get_key(latents, kGridKeys, s.latents).flatten();
  if (grid.numel() != 3 || at::isComplexType(grid.scalar_type()) || grid.scalar_type() == at::kBool)
    fail(s.latents, ": video_grid_thw must be 3 numbers (T, H', W'), found ", grid.scalar_type(), " ", grid.sizes());
  const auto grid_long = grid.to(at::kLong);
  if (!at::equal(grid_long.to(grid.scalar_type()), grid))
    fail(s.latents, ": video_grid_thw must hold integers, found ", grid);
  const auto* thw = grid_long.data_ptr<int64_t>();
  if (thw[0] <= 0 || thw[1] <= 0 || thw[2] <= 0)
    fail(s.latents, ": video_grid_thw must be positive, found (", thw[0], ", ", thw[1], ", ", thw[2], ")");
  int64_t tokens = 0;
  if (__builtin_mul_overflow(thw[0], thw[1], &tokens) || __builtin_mul_overflow(tokens, thw[2], &tokens))
    fail(s.latents, ": video_grid_thw (", thw[0], ", ", thw[1], ", ", thw[2], ") overflows a 64-bit token count");
  if (tokens != video.size(0))
    fail(s.latents, ": video_grid_thw (", thw[0], ", ", thw[1], ", ", thw[2], ") gives ", thw[0] * thw[1] * thw[2],
         " tokens, but the video latent has ", video.size(0), " rows");

  const auto audio_file = read_sample_file(s.audio_latents);
  auto audio = as_rows(get_key(audio_file, kAudioKeys, s.audio_latents), o.audio_in_channels,
                       "audio latent", "audio_in_channels", s.audio_latents);
  const auto conditions = read_sample_file(s.conditions);
  auto text = as_rows(get_key(conditions, kTextKeys, s.conditions), o.text_in_channels,
                      "text embedding", "text_in_channels", s.conditions);
  return {{"video_latent", video},
          {"video_grid_thw", grid_long.clone()},
          {"audio_latent", audio},
          {"text_embed", text}};
}

}  // namespace mmtrain::magihuman
