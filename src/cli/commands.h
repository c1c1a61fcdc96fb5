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

// --storage and --zarr3, for every command that writes checkpoints.
struct StorageArgs {
  std::string storage = "ocdbt";
  bool zarr3 = false;
};
void add_storage_options(CLI::App* cmd, StorageArgs& args);
void apply_storage(const StorageArgs& args, SaveOptions& options);

}  // namespace tessel::cli
