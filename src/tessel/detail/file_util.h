// Internal (not installed): whole-file reads with errors that name the file.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace tessel::file_util {

// Throws IoError naming the path and the system's reason.
std::string read_text(const std::filesystem::path& path);
// Writes `text` to `path` (replacing it); throws IoError naming the file.
void write_text(const std::filesystem::path& path, std::string_view text);

}  // namespace tessel::file_util
