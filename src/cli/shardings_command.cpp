// tessel shardings: resolve a MaxText logical dump through logical axis rules onto a mesh, or
// show one sharding.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/models/maxtext.h"
#include "tessel/models/maxtext_checkpoint.h"
#include "tessel/state/init.h"
#include "tessel/sharding/named_sharding.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/sharding/spec_io.h"
#include "tessel/sharding/visualize.h"

namespace tessel::cli {
namespace {

struct ShardingsArgs {
  ModelArgs model;  // --rules alone (with --logical), or a MaxText model
  std::string logical, mesh, out, spec, shape;
  std::optional<int64_t> devices;
  bool remove_size_one = false, drop_indivisible = false, strict = false, explain = false, show = false;
};

void emit(const ShardingsArgs& a, const std::string& text) {
  if (a.out.empty()) {
    std::cout << text;
    std::cout.flush();
    if (!std::cout) throw IoError("cannot write to standard output");
    return;
  }
  std::ofstream file(a.out, std::ios::binary | std::ios::trunc);
  if (!file) throw IoError(fmt::format("cannot open '{}' for writing", a.out));
  file << text;
  file.close();
  if (!file) throw IoError(fmt::format("error writing '{}'", a.out));
}

std::string logical_text(const LogicalAxes& axes) {
  std::vector<std::string> names;
  for (const auto& n : axes) names.push_back(n ? *n : "None");
  return fmt::format("({})", fmt::join(names, ", "));
}

void resolve_entries(const ShardingsArgs& a, const LogicalRules& rules, const Mesh& mesh,
                     const std::vector<LogicalEntry>& entries) {
  ResolveOptions options{a.remove_size_one, a.drop_indivisible, a.strict};

  std::string text;
  std::vector<NamedEntry> named;
  for (const LogicalEntry& e : entries) {
    if (a.explain) {
      Resolution r = rules.explain(e.axes, mesh, options, e.shape, e.path);
      text += fmt::format("{}  shape {}  logical {}\n", e.path, e.shape.to_string(), logical_text(e.axes));
      text += rules.describe(r, mesh, e.shape);
      named.push_back({e.path, r.spec, e.shape});
    } else {
      named.push_back({e.path, rules.resolve(e.axes, mesh, options, e.shape, e.path), e.shape});
    }
    if (a.show) {
      if (!a.explain) text += fmt::format("{}\n", e.path);
      text += visualize(NamedSharding(mesh, named.back().spec), e.shape) + "\n";
    }
  }
  emit(a, a.explain || a.show ? text : named_dump_json(named, mesh));
}

void run_rules(const ShardingsArgs& a) {
  LogicalRules rules = load_rules(a.model.rules);
  if (a.mesh.empty()) throw ValueError("give --mesh, e.g. --mesh fsdp=16");
  resolve_entries(a, rules, Mesh::parse(a.mesh, rules.mesh_axes()), load_logical_dump(a.logical));
}

// A MaxText model's TrainState, each leaf resolved as MaxText's named_shardings.json has it.
void run_model(const ShardingsArgs& a) {
  const ModelConfig model = load_model(a.model);
  const auto& c = std::get<MaxTextConfig>(model.config);
  const Mesh mesh = model_mesh(model, a.mesh, c.rules, a.devices);
  const State params = eval_shape(maxtext_model(c), mesh, c.rules);
  std::vector<LogicalEntry> entries;
  for (const MaxTextStateEntry& e : maxtext_train_state(c, params)) entries.push_back({e.key, e.logical, e.shape});
  resolve_entries(a, c.rules, mesh, entries);
}

void run_spec(const ShardingsArgs& a) {
  if (a.mesh.empty()) throw ValueError("give --mesh, e.g. --mesh data=2,fsdp=4");
  Mesh mesh = Mesh::parse(a.mesh);
  Shape shape = Shape::parse(a.shape);
  NamedSharding sharding(mesh, PartitionSpec::from_json(a.spec, "--spec"));
  if (a.show) {
    emit(a, visualize(sharding, shape));
    return;
  }
  std::string text = fmt::format("{} for shape {}\n", sharding.to_string(), shape.to_string());
  for (const auto& [device, box] : sharding.devices_indices_map(shape))
    text += fmt::format("  device {:>4}  {}  replica {}\n", device, box.to_string(), sharding.replica_id(device));
  emit(a, text);
}

}  // namespace

void add_shardings_command(CLI::App& app) {
  auto args = std::make_shared<ShardingsArgs>();
  CLI::App* cmd = app.add_subcommand(
      "shardings",
      "Resolve logical axis names to mesh shardings (Flax logical_to_mesh_axes), or show one sharding.\n"
      "  tessel shardings --rules base.yml --logical logical_shardings.json --mesh fsdp=16\n"
      "      prints MaxText's named_shardings.json format. When the rules file declares mesh_axes,\n"
      "      --mesh may name a subset of them (in that order); the others get size 1.\n"
      "  tessel shardings --model models/qwen3-0.6b.yml --base base.yml --devices 16\n"
      "      the same for a MaxText model's TrainState, built from MaxText's files.\n"
      "  tessel shardings --mesh data=2,fsdp=4 --spec '[\"fsdp\", null]' --shape 16,8 --show\n"
      "      draws how one PartitionSpec splits an array (without --show: each device's box).");
  add_model_options(cmd, args->model, "A MaxText model file (with --base): resolve its TrainState's leaves",
                    "Logical axis rules: MaxText YAML (logical_axis_rules, mesh_axes) or JSON; with --base, a "
                    "custom mesh-and-rule file replacing base.yml's");
  path_option(cmd->add_option("--logical", args->logical,
                              "MaxText logical dump: {path: {\"partition_spec\": [names], \"shape\": [...]}}"))
      ->check(CLI::ExistingFile);
  cmd->add_option("--mesh", args->mesh, "Mesh axes and sizes in device order, e.g. data=2,fsdp=4");
  cmd->add_option("--devices", args->devices, "With --model and no --mesh: MaxText's mesh for this many devices");
  cmd->add_flag("--remove-size-one-axes", args->remove_size_one,
                "Drop mesh axes of size 1 from the result (MaxText); a missing axis counts as size 1");
  cmd->add_flag("--drop-indivisible", args->drop_indivisible,
                "Drop mesh axes whose product does not divide the dimension");
  cmd->add_flag("--strict", args->strict,
                "Fail when a named dimension ends unsharded because all its rules were blocked, or has no rule");
  cmd->add_flag("--explain", args->explain, "Print each rule tried per dimension and why, instead of JSON");
  path_option(cmd->add_option("--out", args->out, "Write the output to this file instead of stdout"));
  cmd->add_option("--spec", args->spec, "One PartitionSpec as JSON, e.g. '[\"fsdp\", null]'");
  cmd->add_option("--shape", args->shape, "Global shape for --spec, e.g. 16,8");
  cmd->add_flag("--show", args->show, "Draw the sharding as text (per entry with --rules/--logical)");
  cmd->callback([args]() {
    const ShardingsArgs& a = *args;
    const bool model_mode = !a.model.model.empty() || !a.model.base.empty();
    bool rules_mode = !model_mode && (!a.model.rules.empty() || !a.logical.empty());
    bool spec_mode = !a.spec.empty() || !a.shape.empty();
    if (model_mode) {
      if (a.model.model.empty() || a.model.base.empty())
        throw ValueError(a.model.model.empty() ? "--base needs --model (a MaxText model file)"
                                               : "--model needs --base (MaxText's base.yml)");
      if (!a.logical.empty() || spec_mode) throw ValueError("--model resolves the model's own leaves: leave out --logical, --spec");
      run_model(a);
      return;
    }
    if (rules_mode && spec_mode)
      throw ValueError("use either --rules with --logical, or --spec with --shape, not both");
    if (rules_mode) {
      if (a.model.rules.empty() || a.logical.empty())
        throw ValueError(a.model.rules.empty() ? "--logical needs --rules" : "--rules needs --logical");
      run_rules(a);
    } else if (spec_mode) {
      if (a.spec.empty() || a.shape.empty())
        throw ValueError(a.spec.empty() ? "--shape needs --spec" : "--spec needs --shape");
      if (a.explain || a.strict || a.remove_size_one || a.drop_indivisible)
        throw ValueError("--explain, --strict, --remove-size-one-axes and --drop-indivisible apply to --rules/--logical");
      run_spec(a);
    } else {
      throw ValueError("nothing to do: give --rules and --logical, or --spec and --shape");
    }
  });
}

}  // namespace tessel::cli
