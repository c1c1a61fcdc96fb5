// Test helper for tests/python/test_numerics_vs_jax.py: what `tessel train` computes, written out
// for JAX to compare against.
//   train_probe batches DATA SEED STEPS BATCH SEQ OUT
//       the batches of steps 0..STEPS-1 as one checkpoint item: inputs and targets [STEPS, BATCH, SEQ]
//   train_probe grads MODEL MESH CKPT DATA SEED STEP BATCH SEQ OUT
//       the loss and every gradient of one step from the state saved in CKPT (a `tessel train`
//       directory, its latest step), on MESH: OUT is a checkpoint item of the gradients, OUT.json
//       the loss and the gradient norm
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/core/error.h"
#include "tessel/models/train.h"
#include "tessel/models/model_config.h"

namespace {
using namespace tessel;

void batches(const std::string& data_path, uint64_t seed, int64_t steps, int64_t batch, int64_t seq,
             const std::string& out) {
  Runtime rt = Runtime::host(1);
  const nn::ByteDataset data = nn::ByteDataset::open(data_path);
  const NamedSharding one(Mesh({{"host", 1}}), {});
  HostArray inputs({steps, batch, seq}, DType::kI32), targets({steps, batch, seq}, DType::kI32);
  const size_t per_step = static_cast<size_t>(batch * seq) * sizeof(int32_t);
  for (int64_t t = 0; t < steps; ++t) {
    const nn::Batch b = nn::make_batch(rt, data, {.seed = seed, .step = t}, batch, seq, one);
    const HostArray in = to_host(b.inputs), tg = to_host(b.targets);
    std::copy(in.bytes().begin(), in.bytes().end(), inputs.mutable_bytes().begin() + static_cast<std::ptrdiff_t>(t * per_step));
    std::copy(tg.bytes().begin(), tg.bytes().end(), targets.mutable_bytes().begin() + static_cast<std::ptrdiff_t>(t * per_step));
  }
  State s;
  s.insert("inputs", Variable("batch", device_put(rt, inputs, one)));
  s.insert("targets", Variable("batch", device_put(rt, targets, one)));
  save(out, s);
}

void grads(const std::string& model_path, const std::string& mesh_text, const std::string& ckpt,
           const std::string& data_path, uint64_t seed, int64_t step, int64_t batch, int64_t seq, const std::string& out) {
  const LogicalRules rules = models::default_rules();
  const Mesh mesh = Mesh::parse(mesh_text, rules.mesh_axes());
  Runtime rt = Runtime::host(mesh.device_count());
  models::Trainer trainer(rt, load_model_config(model_path), mesh, rules, {});
  CheckpointManager manager(ckpt, {.read_only = true});
  const State state = manager.restore(rt, *manager.latest_step(), trainer.eval_shape());
  const nn::ByteDataset data = nn::ByteDataset::open(data_path);
  const nn::Batch b = trainer.batch(&data, {.seed = seed, .step = step}, batch, seq);
  const models::StepOutputs result = trainer.run(state, Tensor(b.inputs), Tensor(b.targets), 0);
  save(out, result.grads);
  std::ofstream json(out + ".json");
  json << std::setprecision(17) << "{\"loss\": " << result.metrics.loss << ", \"grad_norm\": " << result.metrics.grad_norm
       << "}\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "batches" && argc == 8) {
      batches(argv[2], std::stoull(argv[3]), std::stoll(argv[4]), std::stoll(argv[5]), std::stoll(argv[6]), argv[7]);
      return 0;
    }
    if (mode == "grads" && argc == 11) {
      grads(argv[2], argv[3], argv[4], argv[5], std::stoull(argv[6]), std::stoll(argv[7]), std::stoll(argv[8]),
            std::stoll(argv[9]), argv[10]);
      return 0;
    }
    std::cerr << "usage: train_probe batches DATA SEED STEPS BATCH SEQ OUT | "
                 "grads MODEL MESH CKPT DATA SEED STEP BATCH SEQ OUT\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "train_probe: " << e.what() << "\n";
    return 1;
  }
}
