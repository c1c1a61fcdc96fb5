// The options every command that runs work on devices shares.
#include <fmt/format.h>

#include "cli/commands.h"
#include "tessel/core/error.h"

namespace tessel::cli {

void add_runtime_options(CLI::App* cmd, RuntimeArgs& args) {
  cmd->add_option("--devices", args.devices,
                  "Virtual CPU devices (default: $TESSEL_DEVICES, else 8)");
  cmd->add_option("--device-memory", args.memory_limit,
                  "Memory limit per device, e.g. 512MiB or 2GB (default: none)")
      ->transform(CLI::AsSizeValue(false));
}

Runtime make_runtime(const RuntimeArgs& args) {
  RuntimeOptions options;
  if (args.devices) {
    if (*args.devices < 1) throw ValueError(fmt::format("--devices must be at least 1, got {}", *args.devices));
    options.devices = *args.devices;
  }
  options.memory_limit = args.memory_limit;
  return Runtime::host(options);
}

}  // namespace tessel::cli
