// Internal (not installed): one HTTP request at a time per thread over libcurl, the connection
// kept for the thread's next request. No retries here: the object store clients decide what a
// failure means (s3.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessel/core/error.h"

namespace tessel::detail {

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::span<const std::byte> body;
  long connect_timeout_s = 20;
  long total_timeout_s = 0;  // 0: none (a stalled transfer still fails after 60 s)
};

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;                            // unless the body went into the caller's bytes
  size_t received = 0;                         // bytes written into the caller's bytes
  bool overflow = false;                       // the server sent more than those bytes hold
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// The request could not complete (no connection, a reset, a stall): worth another try.
class HttpTransportError : public IoError {
 public:
  using IoError::IoError;
};

// Sends `request`. A 2xx body goes into `into` when it is given (at most into.size() bytes;
// `received` says how many came, `overflow` whether more were sent), else into `body`; a non-2xx
// body always into `body` (an error document). Throws HttpTransportError when no response came.
HttpResponse http_send(const HttpRequest& request, std::span<std::byte> into = {});

// Sends `request` up to `attempts` times: again after a dropped connection, a 5xx or a 429 (with
// back_off between). The last answer, whatever its status; HttpTransportError's message, prefixed
// with `what`, as an IoError when no answer came.
HttpResponse http_send_retried(const HttpRequest& request, int attempts, const std::string& what);

// Whether `response` to a GET of `size` bytes at `offset` (with a Range header, into the caller's
// bytes) delivered exactly them: throws IoError naming `where` for a truncated object (416 or
// fewer bytes), a server that ignored the range at a nonzero offset, or one that sent more. Any
// other status than 200 and 206 is the caller's to judge first.
void check_range_response(const HttpResponse& response, const std::string& where, int64_t offset, size_t size);

// Waits before another try of a failed request: full jitter, a random time up to
// min(5 s, 50 ms * 2^attempt).
void back_off(int attempt);

// "2026-12-03T11:00:00Z" (RFC 3339 in UTC, as token services give expiry times: fractional seconds
// and a "+00:00" offset allowed) as seconds since the epoch; nullopt for anything else.
std::optional<int64_t> parse_utc_time(std::string_view text);

// RFC 3986 percent-encoding of everything but unreserved characters (and '/' when keep_slash),
// as AWS's signatures and object URLs need it.
std::string uri_encode(std::string_view text, bool keep_slash);

}  // namespace tessel::detail
