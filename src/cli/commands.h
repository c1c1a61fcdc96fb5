// Subcommands of the tessel executable. Each registers its options and a callback on the app;
// errors propagate as tessel::Error and main() turns them into one line on stderr.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/runtime/runtime.h"

namespace tessel::cli {

void add_shardings_command(CLI::App& app);
void add_reshard_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
void add_train_command(CLI::App& app);

// --devices and --device-memory, for every command that runs work on devices.
struct RuntimeArgs {
  std::optional<int64_t> devices;
  std::optional<int64_t> memory_limit;
};
void add_runtime_options(CLI::App* cmd, RuntimeArgs& args);
Runtime make_runtime(const RuntimeArgs& args);

// --storage and --zarr3, for every command that writes checkpoints.
struct StorageArgs {
  std::string storage = "ocdbt";
  bool zarr3 = false;
};
void add_storage_options(CLI::App* cmd, StorageArgs& args);
void apply_storage(const StorageArgs& args, SaveOptions& options);

}  // namespace tessel::cli
