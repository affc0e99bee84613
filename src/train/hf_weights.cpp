#include "train/hf_weights.h"

#include "core/error.h"
#include "core/finite.h"
#include "core/regular_file.h"
#include "core/sha256.h"
#include "core/text.h"
#include "quant/quantized_rows.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace mmtrain {

WeightSource::WeightSource(const std::string& path) : path_(path) {
  if (std::filesystem::is_regular_file(path)) {
    file_ = std::make_unique<SafetensorsFile>(path);
  } else if (std::filesystem::is_directory(path)) {
    index_ = std::make_unique<SafetensorsIndex>(path);
  } else {
    // Not a file or a directory: say what it is (missing, a FIFO, /dev/zero, a NUL in the name).
    require_regular_file(path, "model weights '" + path + "'", "a .safetensors file or an HF model directory");
  }
  view_ = quant::checkpoint_view(
      stored_names(), [this](const std::string& key) { return stores(key); },
      [this](const std::string& key) { return read_stored(key); },
      [this](const std::string& key) { return stored_info(key).shape; }, "model weights " + path);
  for (const auto& [name, form] : view_.forms) {
    SafetensorsTensorInfo info;
    info.dtype = form.dtype;
    info.shape = form.shape;
    quantized_infos_[name] = info;
  }
}

const std::vector<std::string>& WeightSource::stored_names() const { return file_ ? file_->names() : index_->names(); }

bool WeightSource::stores(const std::string& name) const { return file_ ? file_->contains(name) : index_->contains(name); }

const SafetensorsTensorInfo& WeightSource::stored_info(const std::string& name) const {
  return file_ ? file_->info(name) : index_->info(name);
}

at::Tensor WeightSource::read_stored(const std::string& name) const { return file_ ? file_->read(name) : index_->read(name); }

std::vector<std::string> WeightSource::names() const { return view_.names; }

bool WeightSource::contains(const std::string& name) const {
  return stores(name) && !view_.companions.count(name);
}

const SafetensorsTensorInfo& WeightSource::info(const std::string& name) const {
  if (const auto it = quantized_infos_.find(name); it != quantized_infos_.end()) return it->second;
  return stored_info(name);
}

quant::BaseQuant WeightSource::quantization(const std::string& name) const {
  const auto it = view_.kinds.find(name);
  return it == view_.kinds.end() ? quant::BaseQuant::none : it->second;
}

quant::QuantizedWeight WeightSource::read_quantized(const std::string& name, at::ScalarType public_dtype) const {
  const quant::BaseQuant kind = quantization(name);
  if (kind == quant::BaseQuant::none) fail("model weights ", path_, ": '", name, "' is not stored quantized");
  return quant::read_hf_quantized(name, kind, [this](const std::string& key) { return stores(key); },
                                  [this](const std::string& key) { return read_stored(key); }, public_dtype,
                                  "model weights " + file_of(name));
}

at::Tensor WeightSource::read_rows(const std::string& name, int64_t begin, int64_t end) const {
  at::Tensor rows;
  if (quantization(name) != quant::BaseQuant::none) {
    const auto& shape = info(name).shape;
    if (shape.empty() || begin < 0 || end < begin || end > shape[0])
      fail("model weights ", file_of(name), ": rows [", begin, ", ", end, ") of '", name, "' are out of range");
    rows = quant::dequantize_weight(read_quantized(name), info(name).dtype).narrow(0, begin, end - begin);
  } else {
    rows = file_ ? file_->read_rows(name, begin, end) : index_->read_rows(name, begin, end);
  }
  if (const int64_t bad = first_non_finite(rows); bad >= 0)
    fail("model weights ", file_of(name), ": tensor '", name, "' holds ", rows.reshape(-1)[bad].item<double>(),
         " (element ", bad, " of rows [", begin, ", ", end, ")): refusing to train from non-finite weights");
  return rows;
}

at::Tensor WeightSource::read_full(const std::string& name) const {
  const auto& shape = info(name).shape;
  const at::Tensor full = read_rows(name, 0, shape.empty() ? 1 : shape[0]);
  return shape.empty() ? full.reshape({}) : full;
}

void WeightSource::for_each_data_chunk(const std::string& name,
                                       const std::function<void(const char*, size_t)>& consume) const {
  (file_ ? *file_ : index_->file(name)).for_each_data_chunk(name, consume);
}

std::string WeightSource::file_of(const std::string& name) const {
  if (file_) return path_;
  return (std::filesystem::path(index_->dir()) / index_->file_name(name)).string();
}

std::string source_key_of(const WeightSource& source, const HfAdapter& adapter, const std::string& param_name) {
  const auto key = adapter.hf_key(param_name);
  if (source.contains(key)) return key;
  for (const auto& alias : adapter.hf_key_aliases(param_name))
    if (source.contains(alias)) return alias;
  return "";
}

std::string weights_fingerprint(const std::string& path) {
  const WeightSource source(path);
  auto names = source.stored_names();  // a quantized base's codes and scales included
  std::sort(names.begin(), names.end());
  // Each tensor's data hashed on its own, on as many threads as the machine has (rank 0 alone reads
  // the base while the others wait: SHA-256 runs at about 0.3 GB/s a core, a 48 GB base would take
  // minutes on one), then one hash over every tensor's name, dtype, shape and data hash.
  std::vector<std::string> data_hashes(names.size());
  std::atomic<size_t> next{0};
  std::string failed;
  std::mutex failed_mutex;
  auto work = [&] {
    for (size_t i = next++; i < names.size(); i = next++) {
      try {
        Sha256 hash;
        source.for_each_data_chunk(names[i], [&](const char* data, size_t size) { hash.update(data, size); });
        data_hashes[i] = hash.hex();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(failed_mutex);
        if (failed.empty()) failed = e.what();
      }
    }
  };
  std::vector<std::thread> threads;
  const size_t count = std::min<size_t>({names.size(), std::max(1u, std::thread::hardware_concurrency()), 16});
  for (size_t t = 1; t < count; ++t) threads.emplace_back(work);
  work();
  for (auto& thread : threads) thread.join();
  if (!failed.empty()) fail(failed);
  Sha256 hash;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& info = source.stored_info(names[i]);
    const std::string line = names[i] + "|" + c10::toString(info.dtype) + "|" + shape_str(info.shape) + "|" +
                             data_hashes[i] + "\n";
    hash.update(line.data(), line.size());
  }
  return hash.hex();
}

int64_t load_hf_weights(Model& model, const HfAdapter& adapter, Fsdp& fsdp, const WeightSource& source,
                        uint64_t adapter_seed) {
  const auto& path = source.path();
  std::set<std::string> expected;
  std::vector<std::string> missing;
  int64_t conversions = 0;
  std::map<std::string, std::string> source_key;  // hf_key -> the name in this checkpoint
  std::map<std::string, const Param*> adapters;    // LoRA matrices: not in the source, initialised
  std::map<std::string, int64_t> quant_groups;     // quantized weights: weight rows per stored row
  std::vector<std::string> trained_from_codes;     // trained weights the directory stores quantized
  for (auto& [name, param] : model.named_parameters()) {
    if (param->adapter_dtype) {
      adapters[name] = param;
      continue;
    }
    auto key = source_key_of(source, adapter, name);
    if (key.empty()) {
      missing.push_back(adapter.hf_key(name));
      continue;
    }
    if (key != adapter.hf_key(name)) source_key[adapter.hf_key(name)] = key;
    expected.insert(key);
    const auto& info = source.info(key);
    if (info.shape != param->shape)
      fail("model weights ", path, ": '", key, "' has shape ", shape_str(info.shape), ", the model expects ",
           shape_str(param->shape));
    if (!at::isFloatingType(info.dtype))
      fail("model weights ", path, ": '", key, "' has dtype ", c10::toString(info.dtype), ", expected a float type");
    if (adapter.layout_differs(name)) ++conversions;
    if (param->requires_grad && source.quantization(key) != quant::BaseQuant::none) trained_from_codes.push_back(name);
    if (param->base_quant != quant::BaseQuant::none) {
      const int64_t group = quant::quantized_row_shape(param->base_quant, param->shape).group;
      if (group > 1 && adapter.layout_differs(name))
        fail("model weights ", path, ": '", name, "' is re-laid out from its HF rows, but as ",
             quant::base_quant_name(param->base_quant), " its stored rows hold ", group,
             " weight rows each (its width is not whole blocks): features.lora.base_quant cannot hold it");
      quant_groups[name] = group;
    }
  }
  if (!trained_from_codes.empty())  // a full fine-tune or modules_to_save over a -bnb-4bit / quantize-base directory
    std::printf("[mmtrain] note: %s stores %zu trained weights quantized ('%s'%s): they train from their dequantized "
                "values, the only ones it holds\n",
                path.c_str(), trained_from_codes.size(), trained_from_codes[0].c_str(),
                trained_from_codes.size() > 1 ? ", ..." : "");
  if (!missing.empty()) {
    std::string listed;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) listed += (i ? ", '" : "'") + missing[i] + "'";
    fail("model weights ", path, ": missing ", missing.size(), " keys the model needs: ", listed,
         missing.size() > 8 ? ", ..." : "");
  }
  for (const auto& key : source.names())
    if (!expected.count(key)) fail("model weights ", path, ": unexpected key '", key, "' (not a tensor of the model)");
  if (conversions != adapter.expected_layout_conversions())
    fail("model weights ", path, ": converted the layout of ", conversions, " tensors, the config expects ",
         adapter.expected_layout_conversions(), " (gated layers): refusing to train on a half-converted model");

  auto read = [&](const std::string& key, int64_t b, int64_t e) {
    auto it = source_key.find(key);
    return source.read_rows(it == source_key.end() ? key : it->second, b, e);
  };
  // A quantized frozen weight's stored rows of bytes in the training layout: the checkpoint's own
  // when it stores that format (bitwise what it holds), else quantized here from its values, one
  // whole tensor at a time (kept while the adapter asks for more of its rows). The adapter maps
  // weight rows; a stored row is `group` of them (1 wherever the layout is re-laid, checked above).
  std::string cached_key;
  at::Tensor cached_rows;
  at::ScalarType cached_dtype = at::kFloat;
  const QuantRowReader read_quantized = [&](const std::string& name, quant::BaseQuant kind, int64_t b, int64_t e) {
    const int64_t group = quant_groups.at(name);
    QuantizedRows out;
    out.bytes = adapter.load_rows(name, b * group, e * group, [&](const std::string& key, int64_t row_begin, int64_t row_end) {
      const auto it = source_key.find(key);
      const std::string& stored = it == source_key.end() ? key : it->second;
      if (stored != cached_key) {
        quant::QuantizedWeight q;
        if (source.quantization(stored) == kind) {
          q = source.read_quantized(stored);
          cached_dtype = kind == quant::BaseQuant::nf4 ? q.dtype : source.info(stored).dtype;
        } else {
          const at::Tensor full = source.read_full(stored);
          q = quant::quantize_weight(full, kind);
          cached_dtype = full.scalar_type();
        }
        cached_rows = quant::quantized_rows(q);
        cached_key = stored;
      }
      if (row_begin % group != 0 || row_end % group != 0)
        fail("model weights ", path, ": rows [", row_begin, ", ", row_end, ") of '", key, "' are not whole stored rows of ",
             group);
      return cached_rows.narrow(0, row_begin / group, (row_end - row_begin) / group);
    });
    out.public_dtype = cached_dtype;
    return out;
  };
  fsdp.load_params(
      [&](const std::string& name, int64_t b, int64_t e) {
        if (auto it = adapters.find(name); it != adapters.end()) return param_init_rows(*it->second, name, adapter_seed, b, e);
        return adapter.load_rows(name, b, e, read);
      },
      /*frozen_too=*/true, read_quantized);
  for (auto& [name, param] : model.named_parameters()) {
    if (param->trainable) continue;
    const int64_t rows = param->shape.empty() ? 1 : param->shape[0];
    param->value = read(adapter.hf_key(name), 0, rows).to(fsdp.device(), at::kFloat);
  }
  return conversions;
}

void init_buffers(Model& model, at::Device device) {
  for (auto& [name, param] : model.named_parameters()) {
    if (param->trainable) continue;
    if (!param->init_value) fail("buffer '", name, "' has no init rule and no weights were given");
    param->value = param->init_value().to(device);
  }
}

}  // namespace mmtrain
