#include "tessel/detail/file_util.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel::file_util {

std::string read_text(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw IoError(fmt::format("cannot read '{}': it is a directory", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot open '{}': {}", path.string(), std::strerror(errno)));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw IoError(fmt::format("error reading '{}': {}", path.string(), std::strerror(errno)));
  return buffer.str();
}

void write_text(const std::filesystem::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError(fmt::format("cannot write '{}': {}", path.string(), std::strerror(errno)));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) throw IoError(fmt::format("error writing '{}': {}", path.string(), std::strerror(errno)));
}

}  // namespace tessel::file_util
