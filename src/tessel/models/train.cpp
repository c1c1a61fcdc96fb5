#include "tessel/models/train.h"

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/models/forward.h"
#include "tessel/models/maxtext.h"
#include "tessel/nn/params.h"
#include "tessel/ops/autodiff.h"
#include "tessel/ops/ops.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/state/init.h"

namespace tessel::models {

using nn::Params;
namespace {

constexpr const char* kDefaultRules = R"(# tessel train's default rules (MaxText-style names)
mesh_axes: ['data', 'fsdp', 'tensor']
logical_axis_rules: [
  ['activation_batch', ['data', 'fsdp']],
  ['batch', ['data', 'fsdp']],
  ['vocab', 'tensor'],
  ['embed', 'fsdp'],
  ['mlp', 'tensor'],
  ['heads', 'tensor'],
  ['q_heads', 'tensor'],
  ['kv_heads', 'tensor'],
  ['kv', []],
  ['norm', []],
  ['layers', []],
]
)";

}  // namespace

LogicalRules default_rules() { return parse_rules_yaml(kDefaultRules, "<tessel train default rules>"); }

Trainer::Trainer(const Runtime& rt, ModelConfig model, Mesh mesh, LogicalRules rules, OptimizerConfig optimizer,
                 ResolveOptions resolve)
    : rt_(&rt),
      model_(std::move(model)),
      module_(model_.build()),
      mesh_(std::move(mesh)),
      rules_(std::move(rules)),
      optimizer_(optimizer),
      resolve_(resolve) {
  check_forward(model_, mesh_);
  // The LMs train on bytes: every byte must be a token.
  if (model_.is_lm() && model_.vocab() < 256)
    throw ValueError(fmt::format("{}: the vocabulary has {} tokens; training on bytes needs at least 256",
                                 model_.source.empty() ? model_.family() : model_.source, model_.vocab()));
}

State Trainer::eval_shape() const {
  State params = tessel::eval_shape(module_, mesh_, rules_, resolve_);
  return State::merge({params, nn::init_optimizer(optimizer_, params)});
}

State Trainer::init(uint64_t seed) const {
  State params = tessel::init(*rt_, module_, seed, mesh_, rules_, resolve_);
  return State::merge({params, nn::init_optimizer(optimizer_, params)});
}

NamedSharding Trainer::batch_sharding(int64_t rank) const { return tessel::batch_sharding(mesh_, rules_, rank); }

Batch Trainer::batch(const ByteDataset* data, const DataPosition& at, int64_t batch, int64_t seq) const {
  if (const auto* c = std::get_if<DotReluDotConfig>(&model_.config)) {
    return nn::make_regression_batch(*rt_, at, batch, c->depth, batch_sharding());
  }
  if (!data) throw ValueError("the transformer trains on text: give a dataset");
  return nn::make_batch(*rt_, *data, at, batch, seq, batch_sharding());
}

Tensor Trainer::loss(const State&, const Params& params, const Tensor& inputs, const Tensor& targets) const {
  if (const auto* m = std::get_if<MaxTextConfig>(&model_.config)) {
    const MaxTextOutputs out = maxtext_forward(*m, params, inputs);
    const Tensor ce = ops::cross_entropy(out.logits, targets);
    return out.aux_loss.defined() ? ops::add(ce, out.aux_loss) : ce;
  }
  const Tensor out = model_forward(model_, params, inputs);
  if (!model_.is_lm()) return ops::mean(ops::square(ops::sub(out, targets)));
  return ops::cross_entropy(out, targets);
}

StepOutputs Trainer::run(const State& state, const Tensor& inputs, const Tensor& targets, int64_t step) const {
  auto [param_state, opt_state] = state.split(Filter::kind(kParam), Filter::all());
  Params params = nn::tensors(param_state);
  std::vector<std::string> paths;
  std::vector<Tensor> wrt;
  for (auto& [path, t] : params) {
    t = ops::requires_grad(t);
    paths.push_back(path);
    wrt.push_back(t);
  }
  StepOutputs out;
  out.loss = loss(param_state, params, inputs, targets);
  const std::vector<Tensor> grads = ops::grad(out.loss, wrt);
  std::map<std::string, Array> grad_arrays;
  for (size_t i = 0; i < paths.size(); ++i) {
    const Tensor& g = grads[i];
    if (g.is_abstract()) {
      out.grads.insert(paths[i], Variable::abstract("grad", g.shape(), g.dtype(), g.sharding()));
    } else {
      grad_arrays.emplace(paths[i], g.array());
      out.grads.insert(paths[i], Variable("grad", g.array()));
    }
  }
  out.loss = ops::reduce(out.loss);
  if (!out.loss.is_abstract()) {
    const HostArray host = to_host(out.loss.array());
    out.metrics.loss = host.dtype() == DType::kF32 ? host.values<float>()[0] : host.values<double>()[0];
  }
  const nn::UpdateStats stats = nn::apply_updates(optimizer_, step, param_state, opt_state, grad_arrays);
  out.metrics.grad_norm = stats.grad_norm;
  out.metrics.lr = stats.lr;
  out.state = State::merge({param_state, opt_state});
  return out;
}

StepMetrics Trainer::step(State& state, const Batch& batch, int64_t step) const {
  StepOutputs out = run(state, Tensor(batch.inputs), Tensor(batch.targets), step);
  state = std::move(out.state);
  return out.metrics;
}

StepOutputs Trainer::eval_shape_step(const State& abstract_state, int64_t batch, int64_t seq) const {
  const bool lm = model_.is_lm();
  const int64_t width = lm ? seq : std::get<DotReluDotConfig>(model_.config).depth;
  const DType dtype = lm ? DType::kI32 : DType::kF32;
  const Tensor inputs = Tensor::abstract(Shape{batch, width}, dtype, batch_sharding());
  return run(abstract_state, inputs, inputs, 0);
}

}  // namespace tessel::models
