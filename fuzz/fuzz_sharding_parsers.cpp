// libFuzzer target for every parser of untrusted text in the sharding layer. The first byte
// picks the parser; the rest is its input. tessel::Error is the expected outcome of bad input;
// anything else (another exception, a crash, a sanitizer report, a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessel/core/error.h"
#include "tessel/core/shape.h"
#include "tessel/sharding/mesh.h"
#include "tessel/sharding/named_sharding.h"
#include "tessel/sharding/partition_spec.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/sharding/spec_io.h"
#include "tessel/sharding/visualize.h"

namespace {

// Resolve every rule's own name (alone and together) on a small mesh, to run the resolver on
// whatever the parser accepted.
void exercise(const tessel::LogicalRules& rules) {
  tessel::Mesh mesh = tessel::Mesh::parse("data=2,fsdp=2,tensor=1");
  tessel::LogicalAxes names;
  for (const auto& r : rules.rules()) {
    if (names.size() >= 4) break;
    bool seen = false;
    for (const auto& n : names) seen = seen || (n && *n == r.logical);
    if (!seen) names.push_back(r.logical);
  }
  for (bool strict : {false, true}) {
    try {
      tessel::ResolveOptions options{.remove_size_one_axes = !strict, .drop_indivisible = true, .strict = strict};
      tessel::Shape shape(std::vector<int64_t>(names.size(), 6));
      auto r = rules.explain(names, mesh, options, shape);
      (void)rules.describe(r, mesh, shape);
    } catch (const tessel::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 6) {
      case 0: exercise(tessel::parse_rules_yaml(text, "fuzz.yml")); break;
      case 1: exercise(tessel::parse_rules_json(text, "fuzz.json")); break;
      case 2: {
        tessel::LogicalRules rules{{"embed", {"fsdp"}}, {"mlp", {"tensor", "data"}}, {"vocab", {}}};
        tessel::Mesh mesh = tessel::Mesh::parse("data=2,fsdp=2,tensor=2");
        for (const auto& e : tessel::parse_logical_dump(text, "fuzz.json")) {
          try {
            (void)rules.resolve(e.axes, mesh, {.drop_indivisible = true}, e.shape, e.path);
          } catch (const tessel::Error&) {
          }
        }
        break;
      }
      case 3: {
        tessel::PartitionSpec spec = tessel::PartitionSpec::from_json(text);
        tessel::Mesh mesh = tessel::Mesh::parse("a=2,b=3");
        tessel::NamedSharding s(mesh, spec);
        (void)tessel::visualize(s, tessel::Shape(std::vector<int64_t>(spec.size(), 7)));
        break;
      }
      case 4: {
        tessel::Mesh mesh = tessel::Mesh::parse(text);
        if (mesh.device_count() <= 64) (void)mesh.subgroups(std::vector<std::string>{mesh.axis_names()[0]});
        break;
      }
      case 5: (void)tessel::parse_named_dump(text, "fuzz.json"); break;
    }
  } catch (const tessel::Error&) {
  }
  return 0;
}
