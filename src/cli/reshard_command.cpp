// tessel reshard: place an array on virtual devices under one sharding, reshard it to another,
// check the round trip and print the transfer plan and each device's memory.
#include <chrono>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/runtime/array.h"
#include "tessel/runtime/inspect.h"
#include "tessel/runtime/reshard.h"

namespace tessel::cli {
namespace {

struct ReshardArgs {
  std::string mesh, to_mesh, shape, dtype = "f32", from, to;
  RuntimeArgs runtime;
  bool show = false;
};

// Element i holds i (as the dtype stores it, wrapping for narrow types), so any misplaced byte
// changes the round trip.
HostArray numbered(const Shape& shape, DType dtype) {
  HostArray h(shape, dtype);
  std::span<std::byte> bytes = h.mutable_bytes();
  const size_t item = item_size(dtype);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>((i / item) * 31 + i % item);
  return h;
}

void run(const ReshardArgs& a) {
  Runtime rt = make_runtime(a.runtime);
  Mesh mesh = Mesh::parse(a.mesh);
  Mesh target_mesh = a.to_mesh.empty() ? mesh : Mesh::parse(a.to_mesh);
  Shape shape = Shape::parse(a.shape);
  DType dtype = parse_dtype(a.dtype);
  NamedSharding source(mesh, PartitionSpec::from_json(a.from, "--from"));
  NamedSharding target(target_mesh, PartitionSpec::from_json(a.to, "--to"));
  rt.check_mesh(mesh);
  rt.check_mesh(target_mesh);

  HostArray host = numbered(shape, dtype);
  Array x = device_put(rt, host, source, "source");
  ReshardPlan plan = plan_reshard(x, target);
  auto t0 = std::chrono::steady_clock::now();
  Array y = reshard(x, target);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool identical = to_host(y) == host;

  std::string text = plan.to_string();
  text += fmt::format("reshard took {:.3f} ms ({:.2f} GB/s of target bytes); round trip {}\n",
                      seconds * 1e3, static_cast<double>(y.nbytes()) / seconds / 1e9,
                      identical ? "bit-identical" : "DIFFERS");
  if (a.show) text += visualize(x) + visualize(y);
  text += memory_table(rt);
  std::cout << text;
  if (!identical) throw Error("reshard changed the array's bytes");
}

}  // namespace

void add_reshard_command(CLI::App& app) {
  auto args = std::make_shared<ReshardArgs>();
  CLI::App* cmd = app.add_subcommand(
      "reshard",
      "Put an array on virtual devices, reshard it, and print the plan (bytes local / received per\n"
      "device), the time and each device's memory.\n"
      "  tessel reshard --mesh fsdp=8 --shape 4096,4096 --from '[\"fsdp\", null]' --to '[null, \"fsdp\"]'");
  cmd->add_option("--mesh", args->mesh, "Source mesh, e.g. data=2,fsdp=4")->required();
  cmd->add_option("--to-mesh", args->to_mesh, "Target mesh over the same devices (default: --mesh)");
  cmd->add_option("--shape", args->shape, "Global shape, e.g. 4096,4096")->required();
  cmd->add_option("--dtype", args->dtype, "Element type: f32, bf16, f16, f64, i32, i64, u8, bool")
      ->capture_default_str();
  cmd->add_option("--from", args->from, "Source PartitionSpec as JSON, e.g. '[\"fsdp\", null]'")->required();
  cmd->add_option("--to", args->to, "Target PartitionSpec as JSON")->required();
  cmd->add_flag("--show", args->show, "Also draw both shardings");
  add_runtime_options(cmd, args->runtime);
  cmd->callback([args]() { run(*args); });
}

}  // namespace tessel::cli
