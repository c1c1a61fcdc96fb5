// Errors tessel throws. Every message names the offending thing (parameter path, dimension,
// mesh axis, file and line) so a caller can print it as is.
//
//   try { auto mesh = tessel::Mesh::parse("data=0"); }
//   catch (const tessel::Error& e) { std::cerr << e.what() << "\n"; }  // names axis 'data'
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace tessel {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A value that breaks an invariant: a zero-sized mesh axis, a spec naming an unknown axis.
class ValueError : public Error {
 public:
  using Error::Error;
};

// Logical-to-mesh resolution that cannot give a valid sharding (duplicate logical name,
// a resolved axis the mesh lacks, a strict-mode conflict).
class ShardingError : public Error {
 public:
  using Error::Error;
};

// Malformed text from a file or a string. line and column are 1-based; 0 means unknown.
class ParseError : public Error {
 public:
  ParseError(std::string source, int64_t line, int64_t column, const std::string& message);

  const std::string& source() const { return source_; }
  int64_t line() const { return line_; }
  int64_t column() const { return column_; }

 private:
  std::string source_;
  int64_t line_;
  int64_t column_;
};

// A file that cannot be opened, read or written.
class IoError : public Error {
 public:
  using Error::Error;
};

// A device allocation over the device's memory limit. The message names the device, the request
// and the largest holders of the device's memory.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(int64_t device, int64_t requested, const std::string& message)
      : Error(message), device_(device), requested_(requested) {}
  int64_t device() const { return device_; }
  int64_t requested() const { return requested_; }

 private:
  int64_t device_;
  int64_t requested_;
};

}  // namespace tessel
