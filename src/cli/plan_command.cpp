// tessel plan: the memory plan of a model on a mesh under logical axis rules, from eval_shape
// alone (the mesh may be far larger than this machine: nothing is allocated).
#include <chrono>
#include <iostream>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"
#include "tessel/runtime/device.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/state/init.h"
#include "tessel/models/maxtext.h"
#include "tessel/models/maxtext_checkpoint.h"
#include "tessel/state/plan.h"

namespace tessel::cli {
namespace {

struct PlanArgs {
  ModelArgs model;
  std::string mesh, optimizer = "none", replica_axes = "data,diloco", dump_shardings;
  bool nnx_aux = false;
  bool gradients = false, json = false, list_params = false, check = false;
  bool remove_size_one = false, drop_indivisible = false, strict = false;
  double tolerance = 0.02;
  size_t top = 10;
  std::optional<uint64_t> init_seed;
  RuntimeArgs runtime;
};

// Initializes the model for real on virtual devices and sets each device's peak against the
// plan: the proof that nothing bigger than a device's own blocks was ever allocated.
std::string init_report(const PlanArgs& a, const Module& model, const Mesh& mesh, const LogicalRules& rules,
                        const ResolveOptions& options, const MemoryPlan& p) {
  Runtime rt = make_runtime(a.runtime);
  auto t0 = std::chrono::steady_clock::now();
  State state = init(rt, model, *a.init_seed, mesh, rules, options);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::string out = fmt::format("\ninit (seed {}): {} parameters, {} on {} devices in {:.1f} ms\n", *a.init_seed,
                                state.size(), text_util::format_bytes(state.nbytes()), mesh.device_count(), ms);
  out += fmt::format("{:>8} {:>14} {:>14}\n", "device", "peak", "planned");
  for (int64_t d : mesh.device_ids()) {
    int64_t peak = rt.device(d).memory_stats().peak;
    int64_t want = p.params_by_device[static_cast<size_t>(mesh.position(d))];
    if (peak != want)
      throw Error(fmt::format("device {}: peak {} bytes during init, planned {} (a bug: please report it)", d, peak,
                              want));
    out += fmt::format("{:>8} {:>14} {:>14}\n", d, text_util::format_bytes(peak), text_util::format_bytes(want));
  }
  out += "every device's peak equals its planned bytes\n";
  return out;
}

std::string params_table(const MemoryPlan& p) {
  std::string out = fmt::format("\n{:<60} {:<22} {:>12} {:>12}  {}\n", "parameter", "type", "bytes", "per device",
                                "sharding");
  for (const ParamPlan& q : p.params)
    out += fmt::format("{:<60} {:<22} {:>12} {:>12}  {}\n", q.path, type_string(q.dtype, q.shape),
                       text_util::format_bytes(q.bytes), text_util::format_bytes(q.max_device_bytes),
                       q.spec.to_string());
  return out;
}

void run(const PlanArgs& a) {
  if (a.model.model.empty()) throw ValueError("give --model");
  const ModelConfig config = load_model(a.model);
  LogicalRules rules = model_rules(config, a.model, [] () -> LogicalRules {
    throw ValueError("give --rules (logical axis rules, e.g. MaxText's base.yml)");
  });
  Mesh mesh = model_mesh(config, a.mesh, rules, a.runtime.devices);
  Module model = config.build();
  PlanOptions options;
  options.optimizer = parse_optimizer(a.optimizer);
  options.gradients = a.gradients;
  options.replica_axes.clear();
  for (std::string_view axis : text_util::split_commas(a.replica_axes))
    if (!axis.empty()) options.replica_axes.emplace_back(axis);
  options.tolerance = a.tolerance;
  options.top = a.top;

  const ResolveOptions resolve{a.remove_size_one, a.drop_indivisible, a.strict};
  State abstract = eval_shape(model, mesh, rules, resolve);
  MemoryPlan p = plan(abstract, options);
  if (!a.dump_shardings.empty()) {
    const auto* m = std::get_if<MaxTextConfig>(&config.config);
    if (!m) throw ValueError("--dump-shardings writes MaxText's TrainState: give a MaxText model (--model with --base)");
    write_maxtext_shardings(maxtext_train_state(*m, abstract, a.nnx_aux), a.dump_shardings);
  }
  std::string text = a.json ? p.to_json() : p.to_string() + (a.list_params ? params_table(p) : "");
  if (a.init_seed) {
    if (a.json) throw ValueError("--init prints a table; leave out --json");
    text += init_report(a, model, mesh, rules, resolve, p);
  }
  std::cout << text;
  std::cout.flush();
  if (!std::cout) throw IoError("cannot write to standard output");
  if (a.check && !p.sufficiently_sharded)
    throw ShardingError(fmt::format("parameters are not sufficiently sharded: {:.2f}% of parameter bytes are not "
                                    "sharded on every weight axis (tolerance {:.2f}%)",
                                    100 * p.unsharded_fraction, 100 * a.tolerance));
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Memory plan of a model on a mesh, from eval_shape (no allocation; any mesh size).\n"
      "  tessel plan --model examples/models/transformer.yml --mesh data=2,fsdp=2,tensor=2 \\\n"
      "      --rules rules.yml --optimizer adamw\n"
      "  tessel plan --model maxtext/models/llama3.1-70b.yml --base maxtext/base.yml --devices 256 \\\n"
      "      --optimizer adamw --dump-shardings dump/\n"
      "  prints bytes per device (max/min/mean), the largest replicated parameters and MaxText's\n"
      "  sufficiently-sharded check; --json for machines, --params for every parameter.");
  add_model_options(cmd, args->model,
                    "Model config: tessel's YAML (model: transformer | dot_relu_dot), or MaxText's model file "
                    "with --base",
                    "Logical axis rules: MaxText YAML (logical_axis_rules, mesh_axes) or JSON; with --base, a "
                    "custom mesh-and-rule file replacing base.yml's");
  cmd->add_option("--mesh", args->mesh,
                  "Mesh axes and sizes, e.g. data=16,fsdp=64,tensor=8 (MaxText models: or --devices N and the "
                  "config's ici_* parallelism)");
  path_option(cmd->add_option("--dump-shardings", args->dump_shardings,
                              "Write logical_shardings.json and named_shardings.json of the TrainState here, in "
                              "MaxText's sharding_dump.py format (MaxText models)"));
  cmd->add_flag("--nnx-aux", args->nnx_aux,
                "With --dump-shardings: also what MaxText 0.2.5 (NNX) checkpoints keep under nnx_aux (RNG state, "
                "DeepSeek V3's routing bias)");
  cmd->add_option("--optimizer", args->optimizer, "none, sgd (momentum) or adamw; implies gradients")
      ->check(CLI::IsMember({"none", "sgd", "sgd_momentum", "adamw"}));
  cmd->add_flag("--gradients", args->gradients, "Count one gradient per parameter");
  cmd->add_flag("--remove-size-one-axes", args->remove_size_one, "Drop mesh axes of size 1 (MaxText)");
  cmd->add_flag("--drop-indivisible", args->drop_indivisible,
                "Drop mesh axes whose product does not divide the dimension");
  cmd->add_flag("--strict", args->strict, "Fail on a named dimension left unsharded (blocked or without a rule)");
  cmd->add_option("--replica-axes", args->replica_axes,
                  "Mesh axes parameters are replicated on by design (data parallelism); comma list")
      ->capture_default_str();
  cmd->add_option("--tolerance", args->tolerance, "Sufficiently-sharded tolerance (share of parameter bytes)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--top", args->top, "How many replicated parameters and offenders to list")->capture_default_str();
  cmd->add_flag("--check", args->check, "Exit with an error when the parameters are not sufficiently sharded");
  cmd->add_flag("--params", args->list_params, "Also list every parameter with its sharding");
  cmd->add_flag("--json", args->json, "Print JSON instead of tables");
  cmd->add_option("--init", args->init_seed,
                  "Also initialize the model with this seed on virtual devices and compare each device's "
                  "peak memory with the plan");
  add_runtime_options(cmd, args->runtime);
  cmd->callback([args]() { run(*args); });
}

}  // namespace tessel::cli
