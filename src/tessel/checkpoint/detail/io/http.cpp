#include "tessel/checkpoint/detail/io/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>

namespace tessel::detail {
namespace {

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};

// The thread's handle: curl keeps its connections, so a thread's next request to the same server
// reuses them.
CURL* thread_handle() {
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  thread_local std::unique_ptr<CURL, CurlDeleter> handle(curl_easy_init());
  if (!handle) throw IoError("cannot start an HTTP client (curl_easy_init failed)");
  curl_easy_reset(handle.get());
  return handle.get();
}

struct Receiver {
  HttpResponse* response;
  std::span<std::byte> into;
  bool to_caller() const { return !into.empty() && response->status / 100 == 2; }
};

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* r = static_cast<Receiver*>(user);
  const size_t n = size * count;
  if (r->to_caller()) {
    const size_t room = r->into.size() - r->response->received;
    if (n > room) {
      r->response->overflow = true;
      return 0;  // stops the transfer
    }
    std::memcpy(r->into.data() + r->response->received, data, n);
    r->response->received += n;
  } else if (r->response->body.size() < (size_t{4} << 20)) {  // error documents and listings are small
    r->response->body.append(data, n);
  }
  return n;
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* r = static_cast<Receiver*>(user);
  const size_t n = size * count;
  std::string_view line(data, n);
  if (line.starts_with("HTTP/")) {  // a new response (after a 100 Continue or a redirect)
    r->response->headers.clear();
    const size_t sp = line.find(' ');
    r->response->status = sp == std::string_view::npos ? 0 : std::atol(std::string(line.substr(sp + 1, 3)).c_str());
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return n;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front()))) value.remove_prefix(1);
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) value.remove_suffix(1);
  r->response->headers[name] = std::string(value);
  return n;
}

struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

}  // namespace

HttpResponse http_send(const HttpRequest& request, std::span<std::byte> into) {
  CURL* curl = thread_handle();
  HttpResponse response;
  Receiver receiver{&response, into};
  std::unique_ptr<curl_slist, SlistDeleter> headers;
  auto add = [&](const std::string& line) {
    curl_slist* l = curl_slist_append(headers.get(), line.c_str());
    if (!l) throw IoError("out of memory building an HTTP request");
    (void)headers.release();
    headers.reset(l);
  };
  bool typed = false;
  for (const auto& [name, value] : request.headers) {
    add(name + ": " + value);
    typed = typed || name == "content-type";
  }
  // Else curl's POST sends a form's type, and servers parse the bytes as form fields.
  if (!typed && (request.method == "PUT" || request.method == "POST")) add("Content-Type: application/octet-stream");
  // curl adds "Expect: 100-continue" to large uploads; S3-compatible servers differ in how they
  // answer it, and a request is retried whole anyway.
  add("Expect:");
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, request.connect_timeout_s);
  if (request.total_timeout_s > 0) curl_easy_setopt(curl, CURLOPT_TIMEOUT, request.total_timeout_s);
  // A transfer that moves nothing for 60 s is stalled: failed, so that the caller retries.
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &receiver);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &receiver);
  if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "GET") {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    if (request.method == "PUT" || request.method == "POST") {
      curl_easy_setopt(curl, CURLOPT_POST, 1L);
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, reinterpret_cast<const char*>(request.body.data()));
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    }
  }
  const CURLcode rc = curl_easy_perform(curl);
  if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && response.overflow)) {
    throw HttpTransportError(fmt::format("{} {}: {}", request.method, request.url, curl_easy_strerror(rc)));
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

std::string uri_encode(std::string_view text, bool keep_slash) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

void back_off(int attempt) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  const double cap = std::min(5.0, 0.05 * static_cast<double>(int64_t{1} << std::min(attempt, 10)));
  std::uniform_real_distribution<double> wait(0.0, cap);
  std::this_thread::sleep_for(std::chrono::duration<double>(wait(rng)));
}

void check_range_response(const HttpResponse& response, const std::string& where, int64_t offset, size_t size) {
  const int64_t last = offset + static_cast<int64_t>(size) - 1;
  if (response.status == 416) {
    throw IoError(fmt::format("{}: truncated: bytes [{}, {}) asked, the object ends before {}", where, offset, last + 1,
                              offset));
  }
  // A server that ignores the range sends the object from its start: only right when offset is 0.
  if (response.status == 200 && offset != 0)
    throw IoError(fmt::format("{}: the server ignored the byte range {}-{}", where, offset, last));
  if (response.status == 206 && response.overflow)
    throw IoError(fmt::format("{}: the server sent more than the byte range {}-{}", where, offset, last));
  if (response.received != size && !(response.status == 200 && response.overflow)) {
    throw IoError(fmt::format("{}: truncated: bytes [{}, {}) asked, {} received", where, offset, last + 1,
                              response.received));
  }
}

HttpResponse http_send_retried(const HttpRequest& request, int attempts, const std::string& what) {
  for (int attempt = 1;; ++attempt) {
    try {
      HttpResponse r = http_send(request);
      if ((r.status < 500 && r.status != 429) || attempt >= attempts) return r;
    } catch (const HttpTransportError& e) {
      if (attempt >= attempts) throw IoError(fmt::format("{}: {}", what, e.what()));
    }
    back_off(attempt);
  }
}

std::optional<int64_t> parse_utc_time(std::string_view text) {
  std::tm tm{};
  int consumed = 0;
  const std::string s(text.substr(0, 64));
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec, &consumed) != 6 || consumed != 19)
    return std::nullopt;
  std::string_view rest = text.substr(19);
  if (rest.starts_with('.')) {
    rest.remove_prefix(1);
    if (rest.empty() || !std::isdigit(static_cast<unsigned char>(rest.front()))) return std::nullopt;
    while (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest.front()))) rest.remove_prefix(1);
  }
  if (rest != "Z" && rest != "+00:00") return std::nullopt;
  if (tm.tm_year < 1970 || tm.tm_year > 9999 || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 ||
      tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60)
    return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<int64_t>(timegm(&tm));
}

}  // namespace tessel::detail
