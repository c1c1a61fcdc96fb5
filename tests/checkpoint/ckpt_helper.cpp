// Test helper: writes checkpoints from a separate process, for the crash-safety test (which kills
// it) and the python3-zarr interop script (which reads what it writes).
//   ckpt_helper manager ROOT STEP    save a deterministic state as STEP under a CheckpointManager
//   ckpt_helper item DIR COMPRESSION [LAYOUT]
//                                    save a state of several dtypes and shardings as one item;
//                                    LAYOUT: files, zarr3 or files,zarr3 (default: OCDBT, zarr v2)
#include <cstdlib>
#include <iostream>
#include <string>

#include "tessel/checkpoint/manager.h"
#include "tessel/core/error.h"
#include "tessel/state/init.h"
#include "tessel/models/transformer.h"

namespace {

tessel::LogicalRules rules() {
  return tessel::LogicalRules({{"embed", {"fsdp"}}, {"mlp", {"tensor"}}, {"heads", {"tensor"}}, {"vocab", {"tensor"}}},
                              {"data", "fsdp", "tensor"});
}

// A few megabytes over many parameters, so a kill lands in every phase of a save.
tessel::State model_state(const tessel::Runtime& rt, uint64_t seed) {
  tessel::TransformerConfig cfg;
  cfg.vocab = 256;
  cfg.embed = 64;
  cfg.layers = 4;
  cfg.heads = 4;
  cfg.kv_heads = 4;
  cfg.head_dim = 16;
  cfg.mlp = 128;
  cfg.scan_layers = false;
  return tessel::init(rt, tessel::transformer_lm(cfg), seed, tessel::Mesh::parse("data=2,fsdp=2,tensor=2"), rules());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    tessel::Runtime rt = tessel::Runtime::host(8);
    if (mode == "manager" && argc == 4) {
      const int64_t step = std::stoll(argv[3]);
      tessel::CheckpointManager m(argv[2]);
      m.save(step, model_state(rt, static_cast<uint64_t>(step)), {{"data", "{\"step\": " + std::to_string(step) + "}"}});
      return 0;
    }
    if (mode == "item" && (argc == 4 || argc == 5)) {
      tessel::State s = model_state(rt, 1);
      const tessel::Mesh mesh = tessel::Mesh::parse("x=2,y=4");
      tessel::HostArray ints({5, 7, 3}, tessel::DType::kI32);
      auto v = ints.mutable_values<int32_t>();
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i * 37 % 1001) - 500;
      s.insert("extra/ints", tessel::Variable("batch_stat", tessel::device_put(rt, ints, tessel::NamedSharding(mesh, {{"y"}, {"x"}})),
                                             tessel::Partitioning::by_logical({"embed", "mlp", std::nullopt})));
      tessel::HostArray scalar = tessel::HostArray::from<double>({}, {2.5});
      s.insert("extra/scalar", tessel::Variable("batch_stat", tessel::device_put(rt, scalar, tessel::NamedSharding(mesh, {}))));
      tessel::SaveOptions options;
      options.compression = tessel::Compression::parse(argv[3]);
      options.max_chunk_bytes = 4096;  // several chunks per shard for the larger parameters
      options.rules = rules();
      const std::string layout = argc == 5 ? argv[4] : "";
      options.use_ocdbt = layout.find("files") == std::string::npos;
      options.use_zarr3 = layout.find("zarr3") != std::string::npos;
      tessel::save(argv[2], s, options);
      return 0;
    }
    std::cerr << "usage: ckpt_helper manager ROOT STEP | item DIR COMPRESSION [LAYOUT]\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ckpt_helper: " << e.what() << "\n";
    return 1;
  }
}
