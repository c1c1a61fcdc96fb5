// Subcommands of the tessel executable. Each registers its options and a callback on the app;
// errors propagate as tessel::Error and main() turns them into one line on stderr.
#pragma once

#include <cstdint>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/models/model_config.h"
#include "tessel/runtime/runtime.h"

namespace tessel::cli {

void add_shardings_command(CLI::App& app);
void add_reshard_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
void add_train_command(CLI::App& app);

// --devices and --device-memory, for every command that runs work on devices; --devices-per-process
// for those that run across MPI processes (train).
struct RuntimeArgs {
  std::optional<int64_t> devices;
  std::optional<int64_t> memory_limit;
  std::optional<int64_t> devices_per_process;
  int64_t meeting_timeout = 600;
};
void add_runtime_options(CLI::App* cmd, RuntimeArgs& args);
void add_multi_process_options(CLI::App* cmd, RuntimeArgs& args);
// A runtime in this process, or with --devices-per-process one across the MPI processes mpirun
// started (MPI is initialized then, and ended by end_mpi).
Runtime make_runtime(const RuntimeArgs& args);
// Ends MPI if make_runtime started it. After an error every process reports, they end together;
// after this process's own, the job is aborted unless the others arrive within seconds.
void end_mpi(bool failed);
// "process 1 of 2: " when running across MPI processes, else "".
std::string process_label();

// Makes `option` a path: a URL other than file:///path is refused as a bad command line (object
// stores are not supported yet), before anything is written; file:///path becomes the path.
CLI::Option* path_option(CLI::Option* option);
// A checkpoint to read: a local path (file:///path too) or s3://bucket/prefix, gs://bucket/prefix.
CLI::Option* location_option(CLI::Option* option);

// --storage and --zarr3, for every command that writes checkpoints.
struct StorageArgs {
  std::string storage = "ocdbt";
  bool zarr3 = false;
};
void add_storage_options(CLI::App* cmd, StorageArgs& args);
void apply_storage(const StorageArgs& args, SaveOptions& options);

// --model, --base, --set and --rules: tessel's model YAML, or MaxText's (a model file over
// base.yml with key=value overrides) when --base is given.
struct ModelArgs {
  std::string model, base, rules;
  std::vector<std::string> sets;
};
// `model_help` describes --model; `rules_help` --rules.
void add_model_options(CLI::App* cmd, ModelArgs& args, const std::string& model_help, const std::string& rules_help);
ModelConfig load_model(const ModelArgs& args);
// --rules when given (for a MaxText model its mesh_axes and logical_axis_rules replace base.yml's,
// already applied by load_model), else the MaxText config's, else `fallback`'s.
LogicalRules model_rules(const ModelConfig& model, const ModelArgs& args, const std::function<LogicalRules()>& fallback);
// --mesh when given (axes completed from the rules' mesh_axes); else, for a MaxText model, the mesh
// its ici_*/dcn_* parallelism gives `devices` devices. Throws ValueError when neither applies.
Mesh model_mesh(const ModelConfig& model, const std::string& mesh, const LogicalRules& rules,
                std::optional<int64_t> devices);

}  // namespace tessel::cli
