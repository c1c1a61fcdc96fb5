// The options every command that runs work on devices shares.
#include <cstdlib>
#include <memory>

#include <fmt/format.h>

#include "cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/runtime/mpi.h"

namespace tessel::cli {
namespace {

std::unique_ptr<MpiSession>& session() {
  static std::unique_ptr<MpiSession> s;
  return s;
}

// The number of processes mpirun started this one among (1 when it did not).
int launched_processes() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(name)) return std::max(1, std::atoi(v));
  }
  return 1;
}

}  // namespace

void add_runtime_options(CLI::App* cmd, RuntimeArgs& args) {
  cmd->add_option("--devices", args.devices,
                  "Virtual CPU devices (default: $TESSEL_DEVICES, else 8)");
  cmd->add_option("--device-memory", args.memory_limit,
                  "Memory limit per device, e.g. 512MiB or 2GB (default: none)")
      ->transform(CLI::AsSizeValue(false));
}

void add_multi_process_options(CLI::App* cmd, RuntimeArgs& args) {
  cmd->add_option("--devices-per-process", args.devices_per_process,
                  "Run across the MPI processes mpirun started, each with this many devices "
                  "(mpirun -np 2 tessel train --devices-per-process 4: 8 devices)");
  cmd->add_option("--meeting-timeout", args.meeting_timeout,
                  "Seconds a process waits for the others at a meeting point (a checkpoint save) before it "
                  "gives up, naming the missing ones")
      ->capture_default_str();
}

Runtime make_runtime(const RuntimeArgs& args) {
  RuntimeOptions options;
  if (args.devices && *args.devices < 1) {
    throw ValueError(fmt::format("--devices must be at least 1, got {}", *args.devices));
  }
  options.memory_limit = args.memory_limit;
  if (!args.devices_per_process) {
    if (launched_processes() > 1) {
      throw ValueError(fmt::format("started as one of {} MPI processes: give --devices-per-process (tessel train "
                                   "runs across processes; other commands run in one)",
                                   launched_processes()));
    }
    if (args.devices) options.devices = *args.devices;
    return Runtime::host(options);
  }
  const int64_t k = *args.devices_per_process;
  if (k < 1) throw ValueError(fmt::format("--devices-per-process must be at least 1, got {}", k));
  if (args.meeting_timeout < 1) {
    throw ValueError(fmt::format("--meeting-timeout must be at least 1 second, got {}", args.meeting_timeout));
  }
  // Checked before MPI starts, from what mpirun told this process.
  const int processes = launched_processes();
  if (args.devices && *args.devices != k * processes) {
    throw ValueError(fmt::format("--devices {} does not match {} processes x --devices-per-process {}", *args.devices,
                                 processes, k));
  }
  if (!session()) session() = std::make_unique<MpiSession>();
  options.devices = k;
  options.meeting_timeout = std::chrono::seconds(args.meeting_timeout);
  return mpi_runtime(options);
}

std::string process_label() {
  return session() ? fmt::format("process {} of {}: ", session()->rank(), session()->size()) : "";
}

void end_mpi(bool failed) {
  if (!session()) return;
  if (failed) session()->end_after_error();
  session().reset();
}

}  // namespace tessel::cli
