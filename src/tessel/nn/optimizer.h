// Optimizers over sharded parameters: SGD with momentum and AdamW (optax's definitions), with
// global-norm gradient clipping and a warmup + cosine learning-rate schedule. The optimizer state
// is a State of kind "opt_state" whose every variable has its parameter's shape, dtype and
// sharding, built by the same function from concrete parameters (zeros on the devices) or
// abstract ones (eval_shape: nothing allocated). Updates run on each device's own blocks.
//
//   nn::OptimizerConfig opt{.kind = nn::OptimizerKind::kAdamW, .schedule = {.peak = 3e-3, .warmup = 10}};
//   State opt_state = nn::init_optimizer(opt, params);   // opt_state/mu/<path>, opt_state/nu/<path>
//   nn::UpdateStats s = nn::apply_updates(opt, step, params, opt_state, grads);
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "tessel/runtime/array.h"
#include "tessel/state/state.h"

namespace tessel::nn {

inline constexpr const char* kOptState = "opt_state";

// optax.warmup_cosine_decay_schedule from 0: linear to `peak` over `warmup` steps, then cosine to
// peak * end_fraction at warmup + decay_steps, constant after. decay_steps 0: constant peak.
struct Schedule {
  double peak = 1e-3;
  int64_t warmup = 0;
  int64_t decay_steps = 0;
  double end_fraction = 0.1;
  double at(int64_t step) const;
};

enum class OptimizerKind { kSgd, kAdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  Schedule schedule;
  double momentum = 0.9;  // SGD; 0: plain SGD (no state)
  double b1 = 0.9, b2 = 0.95, eps = 1e-8, weight_decay = 0.1;  // AdamW (MaxText's defaults)
  double clip_norm = 1.0;  // global gradient norm; 0: no clipping
};

// Zeros like every parameter (abstract for abstract parameters): opt_state/mu/<path> (SGD with
// momentum, AdamW) and opt_state/nu/<path> (AdamW).
State init_optimizer(const OptimizerConfig& config, const State& params);

struct UpdateStats {
  double grad_norm = 0;  // before clipping
  double lr = 0;
};

// One update at `step` (0 for the first): clips `grads` (one Array per parameter path, on the
// parameter's sharding) to the global norm, then updates params and opt_state in place.
// Abstract params and state are left as they are (their shapes and shardings do not change).
UpdateStats apply_updates(const OptimizerConfig& config, int64_t step, State& params, State& opt_state,
                          const std::map<std::string, Array>& grads);

// The global L2 norm of `arrays`, each distinct block counted once.
double global_norm(const std::map<std::string, Array>& arrays);

}  // namespace tessel::nn
