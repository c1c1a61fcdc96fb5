// libFuzzer target for model configs (YAML): parse, build the Module, eval_shape it on a small
// mesh and plan it, so whatever the parser accepts runs through the whole abstract path.
// tessel::Error is the expected outcome of bad input; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessel/core/error.h"
#include "tessel/state/init.h"
#include "tessel/models/model_config.h"
#include "tessel/state/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    tessel::ModelConfig config = tessel::parse_model_config(text, "fuzz.yml");
    tessel::Module model = config.build();
    static const tessel::LogicalRules rules({{"vocab", {"tensor"}}, {"embed", {"fsdp"}}, {"mlp", {"tensor"}},
                                             {"heads", {"tensor"}}, {"q_heads", {"tensor"}},
                                             {"kv_heads", {"tensor"}}, {"layers", {}}});
    static const tessel::Mesh mesh = tessel::Mesh::parse("data=2,fsdp=3,tensor=2");
    tessel::MemoryPlan p = tessel::plan(tessel::eval_shape(model, mesh, rules), {.optimizer = tessel::Optimizer::kAdamW});
    (void)p.to_string();
  } catch (const tessel::Error&) {
  }
  return 0;
}
