// libFuzzer target for key maps (YAML): parse with any variables, plan against a small state in
// both directions, and apply what plans. Every input must map or throw tessel::Error, never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessel/checkpoint/key_map.h"
#include "tessel/core/error.h"

namespace {

// Sources: dense layers (0) and their mapped tree (1); experts per layer (2) and stacked (3).
tessel::State sample(int which) {
  tessel::State s;
  auto add = [&](const std::string& path, tessel::Shape shape) {
    s.insert(path, tessel::Variable::abstract(tessel::kParam, std::move(shape), tessel::DType::kF32));
  };
  if (which == 2) {
    for (int i = 0; i < 2; ++i)
      for (int e = 0; e < 3; ++e) add("model/layers/" + std::to_string(i) + "/experts/" + std::to_string(e) + "/w", {6, 4});
    add("model/embed/weight", {8, 4});
  } else if (which == 3) {
    add("decoder/layers/moe/wi", {3, 2, 4, 6});
    add("token_embedder/embedding", {8, 4});
  } else if (which == 1) {
    add("decoder/layers/w", {4, 2, 6});
    add("token_embedder/embedding", {8, 4});
  } else {
    add("model/layers/0/w", {6, 4});
    add("model/layers/1/w", {6, 4});
    add("model/embed/weight", {8, 4});
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tessel::KeyMap map = tessel::parse_key_map(text, "fuzz.yml", {{"d", "2"}});
    for (int which : {0, 1, 2, 3}) {
      try {
        const tessel::State source = sample(which);
        const tessel::MapPlan plan = tessel::plan_key_map(map, source);
        std::map<std::string, tessel::HostArray> values;
        for (const auto& [path, v] : source) values.emplace(path, tessel::HostArray(v.shape(), v.dtype()));
        for (const tessel::MappedTensor& t : plan.tensors) {
          std::vector<const tessel::HostArray*> in;
          for (const std::string& p : t.sources) in.push_back(&values.at(p));
          const tessel::HostArray out = tessel::apply_mapped(t, in);
          if (!(out.shape() == t.shape)) __builtin_trap();
        }
      } catch (const tessel::Error&) {
      }
    }
  } catch (const tessel::Error&) {
  }
  return 0;
}
