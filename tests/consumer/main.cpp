// Uses only installed headers: resolves a logical spec, places an array on 8 virtual devices
// with it, reshards it and checks the round trip.
#include <iostream>
#include <numeric>
#include <vector>

#include <tessel/runtime/array.h>
#include <tessel/runtime/reshard.h>

#include <tessel/sharding/logical_rules.h>
#include <tessel/sharding/named_sharding.h>
#include <tessel/sharding/rules_io.h>

int main() {
  tessel::LogicalRules rules = tessel::parse_rules_yaml("logical_axis_rules: [[embed, fsdp], [mlp, tensor]]\n");
  tessel::Mesh mesh = tessel::Mesh::parse("fsdp=4,tensor=2");
  tessel::PartitionSpec spec = rules.resolve({"embed", "mlp"}, mesh);
  tessel::NamedSharding sharding(mesh, spec);
  std::cout << spec.to_json() << " " << sharding.device_box(7, {16, 8}).to_string() << "\n";
  std::vector<float> values(16 * 8);
  std::iota(values.begin(), values.end(), 0.0f);
  auto host = tessel::HostArray::from<float>({16, 8}, std::span<const float>(values));
  auto rt = tessel::Runtime::host(8);
  tessel::Array x = tessel::device_put(rt, host, sharding);
  tessel::Array y = tessel::reshard(x, tessel::NamedSharding(mesh, {{}, {"fsdp"}}));
  bool ok = spec.to_json() == R"(["fsdp","tensor"])" &&
            sharding.device_box(7, {16, 8}).to_string() == "[12:16, 4:8]" &&
            tessel::to_host(y) == host && y.shard(3).box.to_string() == "[0:16, 2:4]";
  return ok ? 0 : 1;
}
