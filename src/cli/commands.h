// Subcommands of the tessel executable. Each registers its options and a callback on the app;
// errors propagate as tessel::Error and main() turns them into one line on stderr.
#pragma once

#include <CLI/CLI.hpp>

namespace tessel::cli {

void add_shardings_command(CLI::App& app);

}  // namespace tessel::cli
