#include "train/state_adamw8bit.h"

#include "core/error.h"
#include "core/finite.h"
#include "core/text.h"
#include "train/state.h"

namespace mmtrain {
namespace {

const char* kMomentPrefix[2] = {"optim.exp_avg", "optim.exp_avg_sq"};

// A param below min_8bit_size keeps AdamW's fp32 moments under AdamW's keys.
std::string fp32_moment_key(const std::string& name, int moment) {
  return moment ? state_exp_avg_sq_key(name) : state_exp_avg_key(name);
}

std::vector<int64_t> rows_shape(const FsdpParam& param, int64_t rows) {
  std::vector<int64_t> shape = param.param->shape;
  if (shape.empty()) shape = {1};
  shape[0] = rows;
  return shape;
}

// The checkpoint's `key`, checked to be dtype [shape] before anything is read from it.
void check_entry(const CheckpointReader& reader, const std::string& key, at::ScalarType dtype,
                 const std::vector<int64_t>& shape) {
  if (!reader.contains(key))
    fail("checkpoint ", reader.dir(), ": missing tensor '", key, "' (training.optimizer adamw8bit's state)");
  if (reader.dtype(key) != dtype || reader.global_shape(key) != shape)
    fail("checkpoint ", reader.dir(), ": '", key, "' must be ", dtype, " ", shape_str(shape), ", found ",
         reader.dtype(key), " ", shape_str(reader.global_shape(key)));
}

}  // namespace

std::string adamw8bit_codes_key(const std::string& param_name, int moment) {
  return std::string(kMomentPrefix[moment]) + "_codes." + param_name;
}
std::string adamw8bit_absmax_key(const std::string& param_name, int moment) {
  return std::string(kMomentPrefix[moment]) + "_absmax." + param_name;
}

std::vector<ShardedTensor> adamw8bit_param_shards(const AdamW8bit& optimizer, size_t u, const FsdpParam& param, int rank,
                                                  const CheckedTensor& checked) {
  std::vector<ShardedTensor> out;
  const int64_t rows = param.layout.rows(rank), begin = param.layout.row_begin(rank);
  const std::string& name = param.name;
  for (int m = 0; m < 2; ++m) {
    if (!optimizer.is_8bit(u, name)) {
      const std::string key = fp32_moment_key(name, m);
      out.push_back({key, param.param->shape, begin, at::Tensor(), [&optimizer, u, name, m, key, checked, shape = rows_shape(param, rows)] {
                       optimizer.keep_resident(u, /*changing=*/false);
                       return checked(key, optimizer.moment(u, name, m).view(shape));
                     }});
      continue;
    }
    const std::string codes = adamw8bit_codes_key(name, m), absmax = adamw8bit_absmax_key(name, m);
    out.push_back({codes, param.param->shape, begin, at::Tensor(), [&optimizer, u, name, m, shape = rows_shape(param, rows)] {
                     optimizer.keep_resident(u, /*changing=*/false);
                     return optimizer.codes(u, name, m).view(shape);
                   }});
    const auto [owned_begin, owned_end] = optimizer.owned_blocks(u, name);
    const int64_t numel = param.layout.dim0 * param.layout.row_numel;
    out.push_back({absmax, {AdamW8bit::blocks_of(numel)}, owned_begin, at::Tensor(),
                   [&optimizer, u, name, m, absmax, checked, from = owned_begin - optimizer.first_block(u, name),
                    count = owned_end - owned_begin] {
                     optimizer.keep_resident(u, /*changing=*/false);
                     return checked(absmax, optimizer.absmax(u, name, m).narrow(0, from, count));
                   }});
  }
  return out;
}

void adamw8bit_check_absmax(const at::Tensor& absmax, int64_t first_block, const std::string& what) {
  if (const int64_t at = first_non_finite(absmax); at >= 0 || (absmax < 0).any().item<bool>())
    fail(what, " must hold finite absmax >= 0, found ", at >= 0 ? absmax[at].item<double>() : absmax.min().item<double>(),
         " (block ", first_block + (at >= 0 ? at : absmax.argmin().item<int64_t>()), ")");
}

void adamw8bit_load(const CheckpointReader& reader, Fsdp& fsdp, AdamW8bit& optimizer, int rank) {
  const auto units = fsdp.units();
  for (size_t u = 0; u < units.size(); ++u) {
    for (const FsdpParam& param : units[u]->params) {
      if (param.frozen) continue;
      optimizer.keep_resident(u, /*changing=*/true);  // the disk tier: one unit in RAM at a time
      const std::string& name = param.name;
      const int64_t rows = param.layout.rows(rank), begin = param.layout.row_begin(rank);
      for (int m = 0; m < 2; ++m) {
        if (!optimizer.is_8bit(u, name)) {
          const std::string key = fp32_moment_key(name, m);
          check_entry(reader, key, at::kFloat, param.param->shape);
          if (rows > 0) optimizer.moment(u, name, m).copy_(reader.read_rows(key, begin, begin + rows).reshape(-1));
          continue;
        }
        const std::string codes = adamw8bit_codes_key(name, m), absmax = adamw8bit_absmax_key(name, m);
        check_entry(reader, codes, at::kByte, param.param->shape);
        check_entry(reader, absmax, at::kFloat, {AdamW8bit::blocks_of(param.layout.dim0 * param.layout.row_numel)});
        if (rows == 0) continue;
        optimizer.codes(u, name, m).copy_(reader.read_rows(codes, begin, begin + rows).reshape(-1));
        at::Tensor scales = optimizer.absmax(u, name, m);
        const int64_t first = optimizer.first_block(u, name);
        const at::Tensor read = reader.read_rows(absmax, first, first + scales.numel());
        adamw8bit_check_absmax(read, first, "checkpoint " + reader.dir() + ": '" + absmax + "'");
        scales.copy_(read);
      }
    }
  }
  optimizer.release();
}

}  // namespace mmtrain
