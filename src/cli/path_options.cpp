// Options that take a path: a URL is refused on the command line, before any command runs, but
// where a checkpoint may be in a bucket (s3://bucket/prefix, gs://bucket/prefix).
#include "cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/core/location.h"
#include "tessel/core/path.h"

namespace tessel::cli {

CLI::Option* path_option(CLI::Option* option) {
  // A transform runs before the option's checks (ExistingFile), so a URL is named as one.
  return option->transform(CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          value = local_path(value, "").string();
        } catch (const ValueError& e) {
          return e.what();
        }
        return {};
      },
      "", "local path"));
}

CLI::Option* location_option(CLI::Option* option) {
  return option->transform(CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          value = Location::parse(value, "").string();
        } catch (const ValueError& e) {
          return e.what();
        }
        return {};
      },
      "", "local path or bucket URL"));
}

}  // namespace tessel::cli
