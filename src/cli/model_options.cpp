// --model/--base/--set/--rules and the mesh they imply, shared by plan and train.
#include <fmt/format.h>

#include "cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/sharding/rules_io.h"

namespace tessel::cli {

void add_model_options(CLI::App* cmd, ModelArgs& args, const std::string& model_help, const std::string& rules_help) {
  path_option(cmd->add_option("--model", args.model, model_help))->check(CLI::ExistingFile);
  path_option(cmd->add_option("--base", args.base,
                              "MaxText's base.yml: --model is then a MaxText model file (configs/models/<name>.yml) read over it"))
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", args.sets,
                  "MaxText config override key=value, applied last (repeat it), e.g. --set scan_layers=false");
  path_option(cmd->add_option("--rules", args.rules, rules_help))->check(CLI::ExistingFile);
}

ModelConfig load_model(const ModelArgs& a) {
  if (a.base.empty()) {
    if (!a.sets.empty()) throw ValueError("--set overrides a MaxText config: give --base (MaxText's base.yml) too");
    return load_model_config(a.model);
  }
  MaxTextSources sources{.model = a.model, .base = a.base, .overrides = a.sets, .rules = std::nullopt};
  if (!a.rules.empty()) sources.rules = a.rules;
  return load_maxtext_model(sources);
}

LogicalRules model_rules(const ModelConfig& model, const ModelArgs& args, const std::function<LogicalRules()>& fallback) {
  if (const auto* m = std::get_if<MaxTextConfig>(&model.config)) return m->rules;
  if (!args.rules.empty()) return load_rules(args.rules);
  return fallback();
}

Mesh model_mesh(const ModelConfig& model, const std::string& mesh, const LogicalRules& rules,
                std::optional<int64_t> devices) {
  const auto* m = std::get_if<MaxTextConfig>(&model.config);
  if (!mesh.empty()) {
    Mesh out = Mesh::parse(mesh, rules.mesh_axes());
    if (m) m->check_mesh(out);
    return out;
  }
  if (!m) throw ValueError("give --mesh, e.g. --mesh data=2,fsdp=4");
  if (!devices)
    throw ValueError("give --mesh, or --devices N to build MaxText's mesh from the config's ici_*/dcn_* parallelism");
  Mesh out = m->mesh(*devices);
  m->check_mesh(out);
  return out;
}

}  // namespace tessel::cli
