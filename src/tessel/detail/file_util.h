// Internal (not installed): whole-file reads with errors that name the file.
#pragma once

#include <filesystem>
#include <string>

namespace tessel::file_util {

// Throws IoError naming the path and the system's reason.
std::string read_text(const std::filesystem::path& path);

}  // namespace tessel::file_util
