// The two models the train-step benchmarks run (bench_train.cpp, bench_train_rounds.cpp): their
// configs, optimizers, batches, and the products their steps are made of, as BM_Sgemm runs them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/models/model_config.h"
#include "tessel/nn/optimizer.h"

namespace tessel::bench {

struct Gemm {
  int64_t m, n, k;
  bool trans_a, trans_b;
};

struct TrainModel {
  std::string yaml;
  nn::OptimizerConfig optimizer;
  int64_t batch, seq;
  std::vector<Gemm> gemms;
  double step_flops;  // forward GEMMs x 3 (the backward pass needs two products per forward one)

  ModelConfig config() const { return parse_model_config(yaml); }
};

// "mlp": DotReluDot (batch 512, 1024 -> 4096 -> 1024, MSE, SGD); "lm": the small LM (vocab 256,
// embed 256, 4 layers, 4 heads, MLP 1024, seq 128, batch 16, AdamW).
inline TrainModel train_model(const std::string& name) {
  if (name == "mlp") {
    // Two forward products, and backward dW2, dH, dW1 (the batch needs no gradient).
    return {"model: dot_relu_dot\ndepth: 1024\nhidden: 4096\n",
            {.kind = nn::OptimizerKind::kSgd, .schedule = {.peak = 1e-3}, .momentum = 0, .clip_norm = 0},
            512,
            128,
            {{512, 4096, 1024, false, false}, {512, 1024, 4096, false, true}, {1024, 4096, 512, true, false}},
            5.0 * 2 * 512 * 1024 * 4096};
  }
  if (name == "lm") {
    const double b = 16, s = 128, e = 256, layers = 4, m = 1024, v = 256, t = b * s;
    return {"model: transformer\nvocab: 256\nembed: 256\nlayers: 4\nheads: 4\nmlp: 1024\n",
            {.kind = nn::OptimizerKind::kAdamW, .schedule = {.peak = 1e-3}},
            16,
            128,
            {{2048, 1024, 256, false, false}, {2048, 256, 1024, false, true}, {256, 1024, 2048, true, false},
             {2048, 256, 256, false, false}},
            3 * (layers * (2 * t * (4 * e * e + 2 * e * m) + 2 * 2 * b * s * s * e) + 2 * t * e * v)};
  }
  throw ValueError("the benchmark model is mlp or lm, got " + name);
}

}  // namespace tessel::bench
