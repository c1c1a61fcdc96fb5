#include "tessel/checkpoint/detail/io/gcs.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string endpoint_from(std::string url, const char* variable) {
  if (url.find("://") == std::string::npos) url = "http://" + url;  // STORAGE_EMULATOR_HOST may be host:port
  if (!url.starts_with("http://") && !url.starts_with("https://"))
    throw ValueError(fmt::format("{}='{}' is not an http:// or https:// URL", variable, url));
  while (url.ends_with('/')) url.pop_back();
  return url;
}

bool retryable(long status) { return status >= 500 || status == 429 || status == 408; }

// A decimal int64 >= 0 as JSON holds GCS's sizes (a string), or nullopt.
std::optional<int64_t> json_size(const nlohmann::json& j) {
  std::string text;
  if (j.is_string()) {
    text = j.get<std::string>();
  } else if (j.is_number_unsigned()) {
    return static_cast<int64_t>(std::min<uint64_t>(j.get<uint64_t>(), INT64_MAX));
  } else {
    return std::nullopt;
  }
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(text);
}

std::string gs_url(const std::string& bucket, const std::string& key) { return fmt::format("gs://{}/{}", bucket, key); }

// The crc32c= value of an x-goog-hash header ("crc32c=...,md5=..."), or "".
std::string goog_hash_crc32c(const std::string& header) {
  size_t at = 0;
  while (at < header.size()) {
    size_t end = header.find(',', at);
    if (end == std::string::npos) end = header.size();
    std::string_view item(header.data() + at, end - at);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    if (item.starts_with("crc32c=")) return std::string(item.substr(7));
    at = end + 1;
  }
  return {};
}

// A resumable upload (https://cloud.google.com/storage/docs/performing-resumable-uploads): the
// session takes its bytes in order, so parts stream from whichever thread gives the next one.
class GcsUpload final : public PartUpload {
 public:
  // `client` outlives the upload.
  GcsUpload(const GcsClient* client, std::string bucket, std::string key, int64_t part_bytes)
      : client_(client), bucket_(std::move(bucket)), key_(std::move(key)), part_bytes_(part_bytes) {
    const std::string url = fmt::format("{}?uploadType=resumable&name={}", client_->upload_url(bucket_),
                                        uri_encode(key_, false));
    const std::string metadata = nlohmann::json({{"name", key_}}).dump();
    const HttpResponse r = client_->send("POST", url, {{"content-type", "application/json; charset=UTF-8"}},
                                         std::as_bytes(std::span(metadata.data(), metadata.size())));
    if (r.status != 200 && r.status != 201) client_->fail(r, "starting an upload of " + where(), url);
    session_ = r.header("location");
    if (session_.empty()) throw IoError("starting an upload of " + where() + ": the answer has no session Location");
  }
  ~GcsUpload() override {
    if (done_) return;
    try {
      (void)http_send({"DELETE", session_, {}, {}});  // GCS answers 499; an unfinished session expires anyway
    } catch (const Error&) {
    }
  }

  void put_part(int64_t index, std::vector<std::byte> bytes) override {
    std::unique_lock lock(mu_);
    if (index < next_ || pending_.contains(index))
      throw IoError(fmt::format("{}: part {} given twice", where(), index + 1));
    given_bytes_ += static_cast<int64_t>(bytes.size());
    pending_.emplace(index, std::move(bytes));
    stream(lock);
  }

  void complete(int64_t count) override {
    std::unique_lock lock(mu_);
    count_ = count;
    stream(lock);
    if (!done_)
      throw IoError(fmt::format("{}: completed with {} of its {} parts streamed", where(), next_, count));
  }

 private:
  std::string where() const { return gs_url(bucket_, key_); }

  // Sends every part whose turn has come: the next one, once the one after it is given too (or
  // the count is known, for the last part carries the total). One thread streams at a time.
  void stream(std::unique_lock<std::mutex>& lock) {
    while (!streaming_ && !done_) {
      auto it = pending_.find(next_);
      if (it == pending_.end()) return;
      const bool last = count_ >= 0 && next_ == count_ - 1;
      if (!last && !pending_.contains(next_ + 1)) return;
      std::vector<std::byte> bytes = std::move(it->second);
      pending_.erase(it);
      streaming_ = true;
      const int64_t offset = next_ * part_bytes_;
      const int64_t total = last ? given_bytes_ : -1;
      lock.unlock();
      bool finished = false;
      try {
        if (!last && static_cast<int64_t>(bytes.size()) != part_bytes_)
          throw IoError(fmt::format("{}: part {} has {} bytes, not {}", where(), next_ + 1, bytes.size(), part_bytes_));
        crc_ = crc32c(bytes, crc_);
        finished = send_chunk(offset, bytes, total);
      } catch (...) {
        lock.lock();
        streaming_ = false;
        throw;
      }
      lock.lock();
      streaming_ = false;
      ++next_;
      done_ = finished;
    }
  }

  // The bytes at `offset`, resent from wherever the server says it stopped after a failure.
  // `total` >= 0 for the last chunk; returns whether the object is complete.
  bool send_chunk(int64_t offset, std::span<const std::byte> bytes, int64_t total) {
    const int64_t end = offset + static_cast<int64_t>(bytes.size());
    int64_t from = offset;
    for (int attempt = 1;; ++attempt) {
      const std::string range =
          from < end ? fmt::format("bytes {}-{}/{}", from, end - 1, total >= 0 ? std::to_string(total) : "*")
                     : fmt::format("bytes */{}", total >= 0 ? std::to_string(total) : "*");
      std::optional<HttpResponse> r;
      try {
        r = session_put(range, bytes.subspan(static_cast<size_t>(from - offset)));
      } catch (const HttpTransportError& e) {
        if (attempt >= client_->config().max_attempts)
          throw IoError(fmt::format("uploading {}: {} (gave up after {} attempts)", where(), e.what(), attempt));
      }
      if (r && (r->status == 200 || r->status == 201)) return finish(*r, total);
      if (r && r->status == 308) {
        const int64_t held = persisted(*r);
        if (held >= end) return false;
        if (held < from) throw IoError(fmt::format("uploading {}: the server dropped bytes it had taken (holds {}, "
                                                   "{} were sent)", where(), held, from));
        from = held;  // it took part of the chunk: the rest goes again at once
        continue;
      }
      if (r && !retryable(r->status)) client_->fail(*r, "uploading " + where(), session_);
      if (attempt >= client_->config().max_attempts) client_->fail(*r, "uploading " + where(), session_);
      back_off(attempt);
      const std::optional<int64_t> held = status_query(offset, total);
      if (!held) return true;  // the status query answered with the object: complete
      from = std::min(*held, end);
    }
  }

  // Asks the session how many bytes it holds; nullopt when it answers with the whole object.
  std::optional<int64_t> status_query(int64_t offset, int64_t total) {
    for (int attempt = 1;; ++attempt) {
      try {
        const HttpResponse r = session_put(fmt::format("bytes */{}", total >= 0 ? std::to_string(total) : "*"), {});
        if (r.status == 308) {
          const int64_t held = persisted(r);
          if (held < offset)
            throw IoError(fmt::format("uploading {}: the server holds {} bytes, fewer than the {} sent before this "
                                      "part", where(), held, offset));
          return held;
        }
        if (r.status == 200 || r.status == 201) {
          (void)finish(r, total);
          return std::nullopt;
        }
        if (!retryable(r.status)) client_->fail(r, "asking about the upload of " + where(), session_);
      } catch (const HttpTransportError&) {
      }
      if (attempt >= client_->config().max_attempts)
        throw IoError(fmt::format("uploading {}: no answer to a status query after {} attempts", where(), attempt));
      back_off(attempt);
    }
  }

  // A PUT to the session; a token refused in the middle of a long upload is renewed (the refused
  // PUT stored nothing).
  HttpResponse session_put(const std::string& content_range, std::span<const std::byte> body) {
    return client_->send_authorized({"PUT", session_, {{"content-range", content_range}}, body});
  }

  // The bytes a 308 answer says the session holds (Range: bytes=0-N), 0 without a Range.
  int64_t persisted(const HttpResponse& r) const {
    const std::string range = r.header("range");
    if (range.empty()) return 0;
    const size_t dash = range.find('-');
    const std::string last = dash == std::string::npos ? std::string() : range.substr(dash + 1);
    if (!range.starts_with("bytes=0-") || last.empty() || last.find_first_not_of("0123456789") != std::string::npos)
      throw IoError(fmt::format("uploading {}: the server answered Range '{}'", where(), range));
    return std::stoll(last) + 1;
  }

  // The object's answer: its size and CRC-32C must be the bytes streamed.
  bool finish(const HttpResponse& r, int64_t total) {
    const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
    if (total < 0) throw IoError(fmt::format("uploading {}: the server completed the object early", where()));
    if (j.is_discarded() || !j.is_object()) return true;  // nothing to check against
    if (auto size = j.contains("size") ? json_size(j["size"]) : std::nullopt; size && *size != total)
      throw IoError(fmt::format("uploading {}: the server stored {} bytes of {}", where(), *size, total));
    if (auto c = j.find("crc32c"); c != j.end() && c->is_string() && c->get<std::string>() != gcs_crc32c_base64(crc_))
      throw IoError(fmt::format("uploading {}: checksum mismatch: the stored object's CRC-32C is {}, the bytes sent "
                                "have {}", where(), c->get<std::string>(), gcs_crc32c_base64(crc_)));
    return true;
  }

  const GcsClient* client_;
  std::string bucket_, key_;
  int64_t part_bytes_;
  std::string session_;
  std::mutex mu_;
  std::map<int64_t, std::vector<std::byte>> pending_;  // given, not yet sent
  int64_t next_ = 0;                                   // the next part to send
  int64_t count_ = -1;                                 // known at complete()
  int64_t given_bytes_ = 0;
  uint32_t crc_ = 0;  // of the parts sent, in order (only the streaming thread touches it)
  bool streaming_ = false;
  bool done_ = false;
};

}  // namespace

std::string gcs_crc32c_base64(uint32_t crc) {
  const unsigned char be[4] = {static_cast<unsigned char>(crc >> 24), static_cast<unsigned char>(crc >> 16),
                               static_cast<unsigned char>(crc >> 8), static_cast<unsigned char>(crc)};
  unsigned char out[16];
  const int n = EVP_EncodeBlock(out, be, 4);
  return std::string(reinterpret_cast<char*>(out), static_cast<size_t>(n));
}

ObjectListing parse_gcs_list_page(std::string_view body, const std::string& where, std::string* next) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw IoError(where + ": the server's answer is not a JSON object");
  ObjectListing out;
  if (auto items = j.find("items"); items != j.end()) {
    if (!items->is_array()) throw IoError(where + ": \"items\" is not a list");
    for (const nlohmann::json& item : *items) {
      if (!item.is_object() || !item.contains("name") || !item["name"].is_string())
        throw IoError(where + ": an item without a name");
      const std::string name = item["name"].get<std::string>();
      const std::optional<int64_t> size = item.contains("size") ? json_size(item["size"]) : std::nullopt;
      if (!size) throw IoError(fmt::format("{}: object '{}' has no valid size", where, name));
      out.objects.emplace_back(name, *size);
    }
  }
  if (auto prefixes = j.find("prefixes"); prefixes != j.end()) {
    if (!prefixes->is_array()) throw IoError(where + ": \"prefixes\" is not a list");
    for (const nlohmann::json& p : *prefixes) {
      if (!p.is_string()) throw IoError(where + ": a prefix that is not a string");
      out.prefixes.push_back(p.get<std::string>());
    }
  }
  next->clear();
  if (auto token = j.find("nextPageToken"); token != j.end() && !token->is_null()) {
    if (!token->is_string()) throw IoError(where + ": \"nextPageToken\" is not a string");
    *next = token->get<std::string>();
  }
  return out;
}

GcsConfig GcsConfig::from_environment() {
  GcsConfig c;
  if (std::string host = env("STORAGE_EMULATOR_HOST"); !host.empty()) {
    c.endpoint = endpoint_from(host, "STORAGE_EMULATOR_HOST");
    c.auth = GcsAuth::none("none (STORAGE_EMULATOR_HOST names an emulator)");
  } else {
    if (std::string url = env("TENSORSTORE_GCS_HTTP_URL"); !url.empty())
      c.endpoint = endpoint_from(url, "TENSORSTORE_GCS_HTTP_URL");
    c.auth = GcsAuth::from_environment();
  }
  if (std::string n = env("TESSEL_GCS_MAX_ATTEMPTS"); !n.empty()) c.max_attempts = std::max(1, std::atoi(n.c_str()));
  return c;
}

std::shared_ptr<const GcsClient> GcsClient::current() {
  const std::string fingerprint = configuration_fingerprint(
      {"STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING",
       "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "HOME", "GCE_METADATA_HOST", "GCE_METADATA_ROOT",
       "NO_GCE_CHECK", "TESSEL_GCS_MAX_ATTEMPTS"},
      {env("GOOGLE_APPLICATION_CREDENTIALS"), gcloud_adc_file()});
  return cached_client<GcsClient>(fingerprint, [] { return GcsClient(GcsConfig::from_environment()); });
}

std::string GcsClient::object_url(const std::string& bucket, const std::string& key) const {
  if (key.empty()) return fmt::format("{}/storage/v1/b/{}/o", config_.endpoint, uri_encode(bucket, false));
  return fmt::format("{}/storage/v1/b/{}/o/{}", config_.endpoint, uri_encode(bucket, false), uri_encode(key, false));
}

std::string GcsClient::upload_url(const std::string& bucket) const {
  return fmt::format("{}/upload/storage/v1/b/{}/o", config_.endpoint, uri_encode(bucket, false));
}

HttpResponse GcsClient::send(const std::string& method, const std::string& url,
                             std::vector<std::pair<std::string, std::string>> headers, std::span<const std::byte> body,
                             std::span<std::byte> into) const {
  const HttpRequest request{method, url, std::move(headers), body};
  for (int attempt = 1;; ++attempt) {
    const bool last = attempt >= config_.max_attempts;
    try {
      HttpResponse r = send_authorized(request, into);
      if (last || !retryable(r.status)) return r;
    } catch (const HttpTransportError& e) {
      if (last) throw IoError(fmt::format("{} (gave up after {} attempts)", e.what(), attempt));
    }
    back_off(attempt);
  }
}

HttpResponse GcsClient::send_authorized(const HttpRequest& request, std::span<std::byte> into) const {
  auto with = [&](const std::string& authorization) {
    if (authorization.empty()) return http_send(request, into);
    HttpRequest r = request;
    r.headers.emplace_back("authorization", authorization);
    return http_send(r, into);
  };
  const std::string authorization = config_.auth.authorization();
  HttpResponse r = with(authorization);
  if (r.status == 401 && !authorization.empty() && config_.auth.renew_after_refusal(authorization))
    r = with(config_.auth.authorization());
  return r;
}

void GcsClient::fail(const HttpResponse& r, const std::string& what, const std::string& url) const {
  std::string message;
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object()) {
    message = j["error"].value("message", std::string());
  } else if (!r.body.empty() && r.body.size() < 300 && r.body.find('<') == std::string::npos) {
    message = r.body;
  }
  std::string credentials;
  if (r.status == 401 || r.status == 403) credentials = "; credentials: " + config_.auth.hint();
  throw IoError(fmt::format("{}: {} answered HTTP {}{}{}", what, url, r.status,
                            message.empty() ? "" : " (" + message + ")", credentials));
}

std::optional<int64_t> GcsClient::head(const std::string& bucket, const std::string& key) const {
  const std::string url = object_url(bucket, key);
  const HttpResponse r = send("GET", url, {}, {});
  if (r.status == 404) return std::nullopt;
  if (r.status != 200) fail(r, gs_url(bucket, key), url);
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  const std::optional<int64_t> size =
      !j.is_discarded() && j.is_object() && j.contains("size") ? json_size(j["size"]) : std::nullopt;
  if (!size) throw IoError(fmt::format("{}: the server gave no object size", gs_url(bucket, key)));
  return size;
}

void GcsClient::read(const std::string& bucket, const std::string& key, int64_t offset, std::span<std::byte> out) const {
  if (out.empty()) return;
  const std::string where = gs_url(bucket, key);
  const std::string url = object_url(bucket, key) + "?alt=media";
  const int64_t last = offset + static_cast<int64_t>(out.size()) - 1;
  const HttpResponse r = send("GET", url, {{"range", fmt::format("bytes={}-{}", offset, last)}}, {}, out);
  if (r.status != 206 && r.status != 200 && r.status != 416) fail(r, where, url);
  check_range_response(r, where, offset, out.size());
}

std::optional<std::string> GcsClient::read_all(const std::string& bucket, const std::string& key,
                                               int64_t max_bytes) const {
  const std::string where = gs_url(bucket, key);
  const std::string url = object_url(bucket, key) + "?alt=media";
  for (int attempt = 1;; ++attempt) {
    const HttpResponse r = send("GET", url, {}, {});
    if (r.status == 404) return std::nullopt;
    if (r.status != 200) fail(r, where, url);
    if (static_cast<int64_t>(r.body.size()) > max_bytes)
      throw IoError(fmt::format("{}: more than the {} bytes a metadata object may have", where, max_bytes));
    const std::string length = r.header("content-length");
    if (!length.empty() && length != std::to_string(r.body.size()))
      throw IoError(fmt::format("{}: truncated: {} bytes received of {}", where, r.body.size(), length));
    const std::string expected = goog_hash_crc32c(r.header("x-goog-hash"));
    if (expected.empty()) return r.body;
    const std::string got = gcs_crc32c_base64(crc32c(std::as_bytes(std::span(r.body.data(), r.body.size()))));
    if (got == expected) return r.body;
    if (attempt >= config_.max_attempts)
      throw IoError(fmt::format("{}: checksum mismatch: the bytes received have CRC-32C {}, the object's is {} ({} "
                                "attempts)", where, got, expected, attempt));
    back_off(attempt);
  }
}

ObjectListing GcsClient::list(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                              int max_keys) const {
  ObjectListing out;
  std::string token;
  const std::string where = "listing " + gs_url(bucket, prefix);
  do {
    std::string url = object_url(bucket, "") + "?prefix=" + uri_encode(prefix, false);
    if (!delimiter.empty()) url += "&delimiter=" + uri_encode(delimiter, false);
    if (!token.empty()) url += "&pageToken=" + uri_encode(token, false);
    if (max_keys > 0) url += "&maxResults=" + std::to_string(max_keys);
    const HttpResponse r = send("GET", url, {}, {});
    if (r.status != 200) fail(r, where, url);
    append_page(out, parse_gcs_list_page(r.body, where, &token), prefix, where);
    if (max_keys > 0) token.clear();
  } while (!token.empty());
  return out;
}

void GcsClient::put(const std::string& bucket, const std::string& key, std::span<const std::byte> bytes) const {
  const std::string where = "writing " + gs_url(bucket, key);
  const std::string url = fmt::format("{}?uploadType=media&name={}", upload_url(bucket), uri_encode(key, false));
  const std::string crc = gcs_crc32c_base64(crc32c(bytes));
  for (int attempt = 1;; ++attempt) {
    const HttpResponse r = send("POST", url, {{"x-goog-hash", "crc32c=" + crc}}, bytes);
    if (r.status != 200 && r.status != 201) fail(r, where, url);
    const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
    const bool checked = !j.is_discarded() && j.is_object() && j.contains("crc32c") && j["crc32c"].is_string();
    if (!checked || j["crc32c"].get<std::string>() == crc) return;
    if (attempt >= config_.max_attempts)
      throw IoError(fmt::format("{}: checksum mismatch: the stored object's CRC-32C is {}, the bytes sent have {}",
                                where, j["crc32c"].get<std::string>(), crc));
    back_off(attempt);  // stored damaged: written again
  }
}

void GcsClient::remove(const std::string& bucket, const std::string& key) const {
  const std::string url = object_url(bucket, key);
  const HttpResponse r = send("DELETE", url, {}, {});
  if (r.status != 204 && r.status != 200 && r.status != 404) fail(r, "deleting " + gs_url(bucket, key), url);
}

std::unique_ptr<PartUpload> GcsClient::start_upload(const std::string& bucket, const std::string& key,
                                                    int64_t part_bytes) const {
  if (part_bytes <= 0 || part_bytes % (256 << 10) != 0)
    throw ValueError("GCS resumable upload chunks are a multiple of 256 KiB");
  return std::make_unique<GcsUpload>(this, bucket, key, part_bytes);
}

}  // namespace tessel::detail
