// Precompiled header: the heavy, stable headers every translation unit uses.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>
