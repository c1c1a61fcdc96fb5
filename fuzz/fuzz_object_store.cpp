// What an object store's server sends back, which may be anything: S3's ListObjectsV2 pages and
// GCS's objects.list pages, and AWS's temporary credentials (STS's XML, a container endpoint's or
// the instance metadata service's JSON, their expiry times).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessel/checkpoint/detail/io/aws_credentials.h"
#include "tessel/checkpoint/detail/io/gcs.h"
#include "tessel/checkpoint/detail/io/http.h"
#include "tessel/checkpoint/detail/io/s3.h"
#include "tessel/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  std::string next;
  try {
    (void)tessel::detail::parse_list_page(body, "fuzz", &next);
  } catch (const tessel::Error&) {
  }
  try {
    (void)tessel::detail::parse_gcs_list_page(body, "fuzz", &next);
  } catch (const tessel::Error&) {
  }
  try {
    (void)tessel::detail::parse_sts_credentials(body, "fuzz");
  } catch (const tessel::Error&) {
  }
  try {
    (void)tessel::detail::parse_json_credentials(body, "fuzz");
  } catch (const tessel::Error&) {
  }
  try {
    (void)tessel::detail::parse_process_credentials(body, "fuzz");
  } catch (const tessel::Error&) {
  }
  (void)tessel::detail::parse_utc_time(body);
  return 0;
}
