#include "nn/module.h"

#include "core/error.h"

namespace mmtrain {

at::Tensor Module::apply(const std::vector<at::Tensor>& inputs, const BlockFn& fn) {
  if (hooks_) return hooks_->run(*this, inputs, fn);
  return fn(inputs);
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

}  // namespace mmtrain
