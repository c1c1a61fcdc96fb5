// Uses only installed headers: resolves a logical spec and prints the result.
#include <iostream>

#include <tessel/sharding/logical_rules.h>
#include <tessel/sharding/named_sharding.h>
#include <tessel/sharding/rules_io.h>

int main() {
  tessel::LogicalRules rules = tessel::parse_rules_yaml("logical_axis_rules: [[embed, fsdp], [mlp, tensor]]\n");
  tessel::Mesh mesh = tessel::Mesh::parse("fsdp=4,tensor=2");
  tessel::PartitionSpec spec = rules.resolve({"embed", "mlp"}, mesh);
  tessel::NamedSharding sharding(mesh, spec);
  std::cout << spec.to_json() << " " << sharding.device_box(7, {16, 8}).to_string() << "\n";
  return spec.to_json() == R"(["fsdp","tensor"])" && sharding.device_box(7, {16, 8}).to_string() == "[12:16, 4:8]" ? 0 : 1;
}
