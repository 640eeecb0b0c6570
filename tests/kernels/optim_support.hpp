#pragma once
// What the optimizer storage and state tests share: a model of random fp32 tensors, every state
// storage mode to test, and temporary files with their bytes.

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <troupe/kernels/optim.hpp>

namespace optim_support {

struct model {
  std::vector<troupe::kernels::parameter> params;
  explicit model(std::uint32_t seed, std::vector<std::int64_t> sizes) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0, 1);
    for (auto size : sizes) {
      troupe::kernels::parameter p{"p" + std::to_string(size), troupe::tensor::empty({size}), troupe::tensor::empty({size})};
      for (float& v : p.value.data<float>()) v = n(rng);
      params.push_back(std::move(p));
    }
  }
  std::vector<troupe::kernels::parameter*> ptrs() {
    std::vector<troupe::kernels::parameter*> out;
    for (auto& p : params) out.push_back(&p);
    return out;
  }
  void fresh_grads(std::mt19937& rng, float scale = 1) {
    std::normal_distribution<float> n(0, scale);
    for (auto& p : params)
      for (float& g : p.grad.data<float>()) g = n(rng);
  }
  bool same_values(const model& o) const {
    for (std::size_t i = 0; i < params.size(); ++i)
      if (std::memcmp(params[i].value.bytes(), o.params[i].value.bytes(), params[i].value.nbytes()) != 0) return false;
    return true;
  }
};

struct storage_case {
  const char* name;
  troupe::kernels::state_options state;
};

inline std::vector<storage_case> storages() {
  using troupe::kernels::state_options;
  using troupe::kernels::state_storage;
  state_options bf16{.storage = state_storage::bf16};
  state_options bf16_sr = bf16;
  bf16_sr.stochastic_rounding = true;
  state_options bf16_m32_sr = bf16_sr;
  bf16_m32_sr.first_moment_fp32 = true;
  state_options int8{.storage = state_storage::int8, .min_8bit_elements = 1000};
  state_options int8_m32 = int8;
  int8_m32.first_moment_fp32 = true;
  state_options int8_sr = int8;
  int8_sr.stochastic_rounding = true;
  state_options int8_pct = int8;
  int8_pct.percentile_scale = 99.0;
  int8_pct.percentile_clipping = 90;
  state_options int8_p999 = int8;  // the absmax for blocks of up to 1000: the fused kernels
  int8_p999.percentile_scale = 99.9;
  state_options int8_b100 = int8;
  int8_b100.block_size = 100;
  state_options int8_b2048 = int8;
  int8_b2048.block_size = 2048;
  int8_b2048.fp32_params = {"p33001"};
  return {{"fp32", {.storage = state_storage::fp32}},
          {"bf16", bf16},          {"bf16 stochastic", bf16_sr},        {"bf16 m fp32 stochastic", bf16_m32_sr},
          {"int8", int8},
          {"int8 m fp32", int8_m32}, {"int8 stochastic", int8_sr},       {"int8 percentiles", int8_pct},
          {"int8 percentile 99.9", int8_p999},
          {"int8 block 100", int8_b100}, {"int8 block 2048, p33001 fp32", int8_b2048}};
}

inline std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("troupe_optim_" + std::to_string(::getpid()) + "_" + name)).string();
}

}  // namespace optim_support
