// What an object store's server sends back, which may be anything: ListObjectsV2 pages.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessel/checkpoint/detail/io/s3.h"
#include "tessel/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    std::string next;
    (void)tessel::detail::parse_list_page(body, "fuzz", &next);
  } catch (const tessel::Error&) {
  }
  return 0;
}
