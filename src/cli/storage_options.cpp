// How the commands that write checkpoints store the arrays: Orbax's layouts.
#include "cli/commands.h"

namespace tessel::cli {

void add_storage_options(CLI::App* cmd, StorageArgs& args) {
  cmd->add_option("--storage", args.storage,
                  "ocdbt: one OCDBT database per item, as Orbax writes by default; files: a file per chunk")
      ->check(CLI::IsMember({"ocdbt", "files"}))
      ->capture_default_str();
  cmd->add_flag("--zarr3", args.zarr3, "zarr3 arrays (Orbax's v1 API) instead of zarr v2");
}

void apply_storage(const StorageArgs& args, SaveOptions& options) {
  options.use_ocdbt = args.storage == "ocdbt";
  options.use_zarr3 = args.zarr3;
}

}  // namespace tessel::cli
