#include "quant/quantized_weight.h"

#include "core/error.h"
#include "core/text.h"
#include "quant/dynamic_map.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

namespace mmtrain::quant {


namespace {

constexpr const char* kNf4State = ".quant_state.bitsandbytes__nf4";
constexpr const char* kStatePrefix = ".quant_state.bitsandbytes__";

// "<module>." of a weight key "<module>.weight" (bitsandbytes' 8-bit companions hang off the module).
std::string module_prefix(const std::string& key) {
  const std::string suffix = "weight";
  if (key.size() < suffix.size() || key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0)
    fail("quantized weight '", key, "': expected a key ending in 'weight'");
  return key.substr(0, key.size() - suffix.size());
}

// torch's dtype names as bitsandbytes writes them (str(dtype) without "torch.").
std::string torch_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: fail("nf4: the public dtype must be float32, bfloat16 or float16, found ", c10::toString(dtype));
  }
}

at::ScalarType parse_torch_dtype(const std::string& name, const std::string& where) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  fail(where, ": quant_state dtype '", name, "' is not float32, bfloat16 or float16");
}

// Python's repr of a float (the shortest digits that read back to it), which json.dumps writes.
std::string python_float_repr(double value) {
  char text[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  std::string out = text;
  if (out.find_first_of(".en") == std::string::npos) out += ".0";
  return out;
}

at::Tensor bytes_tensor(const std::string& text) {
  at::Tensor t = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), text.data(), text.size());
  return t;
}

// The quant_state's JSON object, checked to be nf4.
nlohmann::json nf4_state(const at::Tensor& bytes, const std::string& what) {
  const at::Tensor state_bytes = bytes.contiguous();
  if (state_bytes.scalar_type() != at::kByte || state_bytes.dim() != 1 || state_bytes.numel() > 4096)
    fail(what, ": its quant_state must be at most 4096 uint8 bytes of JSON");
  const std::string text(reinterpret_cast<const char*>(state_bytes.data_ptr<uint8_t>()), state_bytes.numel());
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(what, ": its quant_state is not JSON (", e.what(), ")");
  }
  if (!state.is_object() || state.value("quant_type", nlohmann::json()) != "nf4")
    fail(what, ": bitsandbytes quant_type ", state.is_object() ? state.value("quant_type", nlohmann::json()).dump() : "?",
         " is not supported (only nf4)");
  return state;
}

float nf4_offset(const nlohmann::json& state, const std::string& what) {
  if (!state.contains("nested_offset") || !state.at("nested_offset").is_number())
    fail(what, ": its quant_state has no numeric nested_offset");
  return state.at("nested_offset").get<float>();
}

// The public shape and dtype an nf4 quant_state records, checked to be the layout mmtrain reads.
PublicForm nf4_public_form(const nlohmann::json& state, const std::string& what) {
  PublicForm form;
  try {
    if (state.at("blocksize") != kNf4Blocksize || !state.contains("nested_blocksize") ||
        state.at("nested_blocksize") != kNf4NestedBlocksize || state.value("nested_dtype", "") != "float32")
      fail(what, ": nf4 with blocksize ", state.at("blocksize").dump(), " and nested_blocksize ",
           state.value("nested_blocksize", nlohmann::json()).dump(),
           ": mmtrain reads blocks of 64 with double-quantized absmax in blocks of 256 (bnb_4bit_use_double_quant)");
    form.dtype = parse_torch_dtype(state.at("dtype").get<std::string>(), what);
    form.shape = state.at("shape").get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    fail(what, ": its quant_state lacks or mistypes a field (", e.what(), ")");
  }
  if (form.shape.size() > 8) fail(what, ": quant_state shape has ", form.shape.size(), " dimensions");
  for (const int64_t d : form.shape)
    if (d < 0 || d > (int64_t{1} << 40)) fail(what, ": quant_state shape ", shape_str(form.shape), " is out of range");
  return form;
}

}  // namespace

const char* base_quant_name(BaseQuant kind) {
  switch (kind) {
    case BaseQuant::none: return "none";
    case BaseQuant::nf4: return "nf4";
    case BaseQuant::int8: return "int8";
    case BaseQuant::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

BaseQuant parse_base_quant(const std::string& text, const std::string& what) {
  for (const BaseQuant kind : {BaseQuant::none, BaseQuant::nf4, BaseQuant::int8, BaseQuant::fp8_e4m3})
    if (text == base_quant_name(kind)) return kind;
  fail(what, ": '", text, "' is not a base quantization; expected none, nf4, int8 or fp8_e4m3");
}

QuantizedWeight quantize_weight(const at::Tensor& weight, BaseQuant kind) {
  QuantizedWeight q;
  q.kind = kind;
  q.shape = weight.sizes().vec();
  q.dtype = weight.scalar_type();
  switch (kind) {
    case BaseQuant::nf4: q.nf4 = quantize_nf4(weight); break;
    case BaseQuant::int8: q.rowwise = quantize_int8_rowwise(weight); break;
    case BaseQuant::fp8_e4m3: q.rowwise = quantize_fp8_rowwise(weight); break;
    case BaseQuant::none: fail("quantize_weight: no format (base_quant none)");
  }
  return q;
}

at::Tensor dequantize_weight(const QuantizedWeight& q, at::ScalarType dtype) {
  return q.kind == BaseQuant::nf4 ? dequantize_nf4(q.nf4, dtype) : dequantize_rowwise(q.rowwise, dtype);
}

int64_t stored_bytes(const QuantizedWeight& q) {
  auto bytes = [](const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
  if (q.kind == BaseQuant::nf4) return bytes(q.nf4.packed) + bytes(q.nf4.absmax_codes) + bytes(q.nf4.nested_absmax) + 4;
  return bytes(q.rowwise.codes) + bytes(q.rowwise.scales);
}

std::vector<std::pair<std::string, at::Tensor>> hf_tensors(const std::string& key, const QuantizedWeight& q) {
  const std::string prefix = module_prefix(key);
  switch (q.kind) {
    case BaseQuant::nf4: {
      nlohmann::ordered_json state = {{"quant_type", "nf4"},
                                      {"blocksize", kNf4Blocksize},
                                      {"dtype", torch_dtype_name(q.dtype)},
                                      {"shape", q.shape},
                                      {"nested_blocksize", kNf4NestedBlocksize},
                                      {"nested_dtype", "float32"},
                                      {"nested_offset", 0.0}};
      // json.dumps' separators (", ", ": ") and Python's float repr of the offset.
      std::string text = state.dump();
      std::string spaced;
      bool in_string = false;
      for (const char c : text) {
        spaced += c;
        if (c == '"') in_string = !in_string;
        if (!in_string && (c == ',' || c == ':')) spaced += ' ';
      }
      const std::string zero = "\"nested_offset\": 0.0";
      spaced.replace(spaced.find(zero), zero.size(),
                     "\"nested_offset\": " + python_float_repr(static_cast<double>(q.nf4.offset)));
      return {{key, q.nf4.packed.unsqueeze(1)},
              {key + ".absmax", q.nf4.absmax_codes},
              {key + ".quant_map", nf4_levels_tensor()},
              {key + ".nested_absmax", q.nf4.nested_absmax},
              {key + ".nested_quant_map", dynamic_map().clone()},
              {key + kNf4State, bytes_tensor(spaced)}};
    }
    case BaseQuant::int8:
      return {{key, q.rowwise.codes}, {prefix + "SCB", q.rowwise.scales}, {prefix + "weight_format", at::zeros({}, at::kByte)}};
    case BaseQuant::fp8_e4m3:
      return {{key, q.rowwise.codes}, {prefix + "scale_weight", q.rowwise.scales}};
    case BaseQuant::none: break;
  }
  fail("hf_tensors: no format (base_quant none)");
}

std::vector<std::string> hf_companion_keys(const std::string& key, BaseQuant kind) {
  const std::string prefix = module_prefix(key);
  switch (kind) {
    case BaseQuant::nf4:
      return {key + ".absmax", key + ".quant_map", key + ".nested_absmax", key + ".nested_quant_map", key + kNf4State};
    case BaseQuant::int8: return {prefix + "SCB", prefix + "weight_format"};
    case BaseQuant::fp8_e4m3: return {prefix + "scale_weight"};
    case BaseQuant::none: return {};
  }
  return {};
}

BaseQuant stored_quant(const std::string& key, const HasKey& has) {
  if (key.size() < 6 || key.compare(key.size() - 6, 6, "weight") != 0) return BaseQuant::none;
  if (has(key + kNf4State)) return BaseQuant::nf4;
  for (const char* other : {"fp4", "int4", "int8"})
    if (has(key + kStatePrefix + other))
      fail("quantized weight '", key, "': bitsandbytes quant_type '", other, "' is not supported (only nf4)");
  const std::string prefix = module_prefix(key);
  if (has(prefix + "SCB")) return BaseQuant::int8;
  if (has(prefix + "scale_weight")) return BaseQuant::fp8_e4m3;
  if (has(key + ".absmax")) fail("quantized weight '", key, "': an absmax without a bitsandbytes quant_state");
  return BaseQuant::none;
}

CheckpointView checkpoint_view(const std::vector<std::string>& stored, const HasKey& has, const ReadKey& read,
                               const StoredShape& stored_shape, const std::string& where) {
  CheckpointView view;
  std::set<std::string>& companions = view.companions;
  for (const auto& name : stored) {
    const BaseQuant kind = stored_quant(name, has);
    if (kind == BaseQuant::none) continue;
    for (const auto& companion : hf_companion_keys(name, kind))
      if (has(companion)) companions.insert(companion);
    view.kinds[name] = kind;
    view.forms[name] = hf_public_form(name, kind, read, stored_shape(name), where);
  }
  for (const auto& name : stored)
    if (!companions.count(name)) view.names.push_back(name);
  return view;
}

namespace {

// An 8-bit weight's codes, not only its scales: fp8 codes 0x7F / 0xFF are NaN, and a row's largest
// value |code| * scale (/ 127 for int8) must be finite in public_dtype (an int8 scale of 1e38 is a
// finite fp32 that is Inf in fp16). Fails naming `what`.
void check_rowwise_values(const RowwiseWeight& w, BaseQuant kind, at::ScalarType public_dtype, const std::string& what) {
  if (kind == BaseQuant::fp8_e4m3) {
    const at::Tensor nan = w.codes.view(at::kByte).bitwise_and(0x7F).eq(0x7F);
    if (nan.any().item<bool>())
      fail(what, ": its fp8_e4m3 codes hold NaN (0x7F / 0xFF), the first at element ",
           nan.reshape({-1}).nonzero()[0].item<int64_t>());
  }
  if (w.codes.size(0) == 0) return;
  const double divisor = kind == BaseQuant::int8 ? 127.0 : 1.0;
  std::vector<at::Tensor> row_max;  // |code| per row, 1024 rows at a time (a float copy of the whole would be 4x it)
  for (int64_t begin = 0; begin < w.codes.size(0); begin += 1024)
    row_max.push_back(w.codes.narrow(0, begin, std::min<int64_t>(1024, w.codes.size(0) - begin)).to(at::kFloat).abs().amax(1));
  const at::Tensor largest = at::cat(row_max).to(at::kDouble) * w.scales.to(at::kDouble) / divisor;  // [out]
  const double limit = public_dtype == at::kHalf ? 65504.0 : static_cast<double>(std::numeric_limits<float>::max());
  const at::Tensor over = largest.gt(limit);
  if (over.any().item<bool>()) {
    const int64_t row = over.nonzero()[0].item<int64_t>();
    fail(what, ": row ", row, " dequantizes to ", largest[row].item<double>(), ", beyond what ",
         c10::toString(public_dtype), " holds (its scale is ", w.scales[row].item<float>(), ")");
  }
}

}  // namespace

QuantizedWeight read_hf_quantized(const std::string& key, BaseQuant kind, const HasKey& has, const ReadKey& read,
                                  at::ScalarType public_dtype, const std::string& where) {
  const std::string what = where + ": '" + key + "'";
  QuantizedWeight q;
  q.kind = kind;
  if (kind == BaseQuant::nf4) {
    const nlohmann::json state = nf4_state(read(key + kNf4State), what);
    const PublicForm form = nf4_public_form(state, what);
    q.shape = form.shape;
    q.dtype = form.dtype;
    q.nf4.offset = nf4_offset(state, what);
    q.nf4.shape = q.shape;
    q.nf4.dtype = q.dtype;
    q.nf4.packed = read(key).reshape({-1}).contiguous();
    q.nf4.absmax_codes = read(key + ".absmax").reshape({-1}).contiguous();
    q.nf4.nested_absmax = read(key + ".nested_absmax").reshape({-1}).contiguous();
    q.nf4.check(what);
    if (!read(key + ".quant_map").equal(nf4_levels_tensor()))
      fail(what, ": its quant_map is not the 16 NF4 levels");
    if (!read(key + ".nested_quant_map").equal(dynamic_map()))
      fail(what, ": its nested_quant_map is not bitsandbytes' dynamic map");
    return q;
  }
  const std::string prefix = module_prefix(key);
  if (kind == BaseQuant::int8 && has(prefix + "weight_format")) {
    // bitsandbytes' older int8 layouts (col32, col_turing, col_ampere) tile the rows otherwise.
    const at::Tensor format = read(prefix + "weight_format");
    if (format.numel() != 1 || !at::isIntegralType(format.scalar_type(), /*includeBool=*/false) ||
        format.reshape({-1})[0].item<int64_t>() != 0)
      fail(what, ": int8 weight_format ", format.numel() == 1 ? format.reshape({-1})[0].item<int64_t>() : -1,
           " is not 0 (row-major): bitsandbytes' tiled int8 layouts are not supported");
  }
  q.rowwise.codes = read(key);
  q.rowwise.scales = read(prefix + (kind == BaseQuant::int8 ? "SCB" : "scale_weight"));
  const at::ScalarType code_type = kind == BaseQuant::int8 ? at::kChar : at::kFloat8_e4m3fn;
  if (q.rowwise.codes.dim() != 2 || q.rowwise.codes.scalar_type() != code_type ||
      q.rowwise.scales.scalar_type() != at::kFloat || q.rowwise.scales.dim() != 1 ||
      q.rowwise.scales.size(0) != q.rowwise.codes.size(0))
    fail(what, ": ", base_quant_name(kind), " expects ", c10::toString(code_type), " codes [out, in] and fp32 scales [out], found ",
         c10::toString(q.rowwise.codes.scalar_type()), " ", shape_str(q.rowwise.codes.sizes().vec()), " and ",
         c10::toString(q.rowwise.scales.scalar_type()), " ", shape_str(q.rowwise.scales.sizes().vec()));
  if (!at::isfinite(q.rowwise.scales).all().item<bool>()) fail(what, ": its row scales hold NaN or Inf");
  check_rowwise_values(q.rowwise, kind, public_dtype, what);
  q.shape = q.rowwise.codes.sizes().vec();
  q.dtype = public_dtype;
  return q;
}

PublicForm hf_public_form(const std::string& key, BaseQuant kind, const ReadKey& read,
                          const std::vector<int64_t>& stored_shape, const std::string& where) {
  if (kind != BaseQuant::nf4) return {stored_shape, at::kFloat};
  const std::string what = where + ": '" + key + "'";
  return nf4_public_form(nf4_state(read(key + kNf4State), what), what);
}

}  // namespace mmtrain::quant
