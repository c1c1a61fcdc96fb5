// tessel: the command-line tool. Exit codes: 0 success, 1 bad input or failed work (one line on
// stderr naming what is wrong), 2 bad command line.
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "tessel/core/error.h"

namespace {

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessel: GSPMD-style sharding of model state (meshes, partition specs, logical axis rules, sharded arrays)"};
  app.name("tessel");
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessel 0.1.0");
  tessel::cli::add_shardings_command(app);
  tessel::cli::add_reshard_command(app);
  tessel::cli::add_plan_command(app);
  tessel::cli::add_ckpt_command(app);
  tessel::cli::add_train_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "tessel: error: " << one_line(e.what()) << " (see tessel --help)\n";
    return 2;
  } catch (const tessel::Error& e) {
    std::cerr << "tessel: error: " << one_line(e.what()) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "tessel: internal error: " << one_line(e.what()) << "\n";
    return 1;
  }
  return 0;
}
