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

// One write per line: the lines of several processes share mpirun's stderr.
void report(const std::string& line) { std::cerr << line + "\n" << std::flush; }

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
  int rc = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "tessel: error: " << one_line(e.what()) << " (see tessel --help)\n";
    return 2;
  } catch (const tessel::Error& e) {
    report("tessel: error: " + tessel::cli::process_label() + one_line(e.what()));
    rc = 1;
  } catch (const std::exception& e) {
    report("tessel: internal error: " + tessel::cli::process_label() + one_line(e.what()));
    rc = 1;
  }
  tessel::cli::end_mpi(rc != 0);
  return rc;
}
