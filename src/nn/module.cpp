#include "nn/module.h"

#include "core/error.h"
#include "core/module_pattern.h"

#include <ATen/CPUGeneratorImpl.h>

#include <functional>

namespace mmtrain {

namespace {

using HookChain = std::shared_ptr<std::vector<std::shared_ptr<BlockHook>>>;

// Hooks [index, end) of chain around fn. Everything is held by value: the recompute hook keeps
// `next` for backward.
at::Tensor run_chain(const HookChain& chain, size_t index, const std::vector<at::Tensor>& inputs, BlockPass pass,
                     const BlockFn& fn) {
  if (index == chain->size()) return fn(inputs);
  BlockNext next = [chain, index, fn](const std::vector<at::Tensor>& in, BlockPass p) {
    return run_chain(chain, index + 1, in, p, fn);
  };
  return (*chain)[index]->run(inputs, pass, next);
}

}  // namespace

at::Tensor Module::apply(const std::vector<at::Tensor>& inputs, const BlockFn& fn) {
  if (!hooks_) return fn(inputs);
  return run_chain(hooks_, 0, inputs, BlockPass::forward, fn);
}

void Module::add_hook(std::shared_ptr<BlockHook> hook) {
  if (!is_block_) fail("Module::add_hook: only a block (a module the model runs through apply) takes hooks");
  if (!hooks_) hooks_ = std::make_shared<std::vector<std::shared_ptr<BlockHook>>>();
  hooks_->push_back(std::move(hook));
}

at::Tensor param_init_rows(const Param& param, const std::string& name, uint64_t seed, int64_t begin, int64_t end) {
  // The whole param is drawn (one at a time: memory is bounded by the largest), then its rows
  // taken, so the values do not depend on how the rows are split.
  at::Tensor full;
  if (param.init == Param::Init::constant) {
    full = at::full(param.shape, param.init_constant, at::kFloat);
  } else {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + std::hash<std::string>{}(name));
    full = at::empty(param.shape, at::kFloat);
    if (param.init == Param::Init::normal)
      full.normal_(0.0, param.init_std, gen);
    else
      full.uniform_(-param.init_bound, param.init_bound, gen);
  }
  return full.narrow(0, begin, end - begin);
}

Param& Module::add_param(const std::string& name, std::vector<int64_t> shape) {
  for (const auto& p : params_)
    if (p->local_name == name) fail("module already has a parameter named '", name, "'");
  auto param = std::make_unique<Param>();
  param->local_name = name;
  param->shape = std::move(shape);
  params_.push_back(std::move(param));
  return *params_.back();
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out{{prefix, this}};
  for (auto& [name, child] : children_) {
    auto sub = child->named_modules(prefix.empty() ? name : prefix + "." + name);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::pair<std::string, Param*>> Module::named_parameters(const std::string& prefix) {
  std::vector<std::pair<std::string, Param*>> out;
  for (auto& [module_name, module] : named_modules(prefix))
    for (auto& [param_name, param] : module->own_parameters())
      out.emplace_back(module_name.empty() ? param_name : module_name + "." + param_name, param);
  return out;
}

std::vector<std::pair<std::string, Param*>> Module::own_parameters() {
  std::vector<std::pair<std::string, Param*>> out;
  for (auto& p : params_) out.emplace_back(p->local_name, p.get());
  return out;
}

std::vector<std::pair<std::string, Module*>> select_blocks(Module& model, const std::vector<std::string>& patterns,
                                                          const std::string& key) {
  const auto modules = model.named_modules();
  std::vector<std::string> names;
  for (const auto& [name, module] : modules) names.push_back(name);
  for (const auto& pattern : patterns)
    if (modules_matching({pattern}, names).empty())
      fail(key, ": pattern '", pattern, "' matches no module of the model");
  std::vector<std::pair<std::string, Module*>> selected;
  for (const auto& [name, module] : modules) {
    bool matched = false;
    for (const auto& pattern : patterns) matched = matched || (!name.empty() && module_pattern_matches(pattern, name));
    if (!matched) continue;
    if (!module->is_block())
      fail("module '", name, "' is selected by ", key, " but the model does not run it as a block "
           "(Module::apply); select one of its blocks instead");
    selected.emplace_back(name, module);
  }
  return selected;
}

}  // namespace mmtrain
