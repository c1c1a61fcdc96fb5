// Runs the tessel executable and checks the one-line error contract.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace tessel {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct Result {
  int rc;
  std::string out, err;
};

inline Result run(const std::string& args) {
  testing::TempDir dir;
  std::string out = (dir.path() / "out").string(), err = (dir.path() / "err").string();
  std::string cmd = std::string(TESSEL_CLI) + " " + args + " >" + out + " 2>" + err;
  int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::read_file(out), testing::read_file(err)};
}

// A failure prints exactly one line on stderr, starting with "tessel: error:".
inline void expect_one_line_error(const Result& r, int rc, const std::string& needle) {
  EXPECT_EQ(r.rc, rc) << r.err;
  EXPECT_THAT(r.err, StartsWith("tessel: error: "));
  EXPECT_THAT(r.err, HasSubstr(needle));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.out, "");
}

}  // namespace tessel
