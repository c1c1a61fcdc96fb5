#include "tessel/checkpoint/detail/io/s3.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/md5.h>
#include <openssl/sha.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fmt/format.h>
#include <pugixml.hpp>

#include "tessel/core/error.h"

namespace tessel::detail {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// The settings of section `section` of an AWS INI file (credentials: "[name]", config:
// "[profile name]" or "[default]"); empty when the file or the section is absent. Indented lines
// (a service's nested settings) are skipped.
std::map<std::string, std::string> ini_section(const std::string& path, const std::string& section) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  if (!in) return out;
  std::string line, current;
  bool found = false;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t[0] == '[') {
      if (t.back() != ']') throw ParseError(path, number, 1, "a section header without ']'");
      current = trim(std::string_view(t).substr(1, t.size() - 2));
      found = found || current == section;
      continue;
    }
    if (current != section || std::isspace(static_cast<unsigned char>(line[0]))) continue;
    const size_t eq = t.find('=');
    if (eq == std::string::npos) throw ParseError(path, number, 1, "expected 'name = value'");
    out[trim(std::string_view(t).substr(0, eq))] = trim(std::string_view(t).substr(eq + 1));
  }
  return out;
}

std::string home_file(const char* variable, const char* name) {
  if (std::string v = env(variable); !v.empty()) return v;
  const std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/.aws/" + name;
}

std::string hex(const unsigned char* data, size_t n) {
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", data[i]);
  return out;
}

std::string hmac(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

std::string sha256_of(std::string_view s) { return sha256_hex(std::as_bytes(std::span(s.data(), s.size()))); }

// S3's answer to temporary credentials past their life (or revoked before it). An answer to HEAD
// has no body to say so: its 400 or 403 may be that too.
bool expired_credentials(const std::string& method, long status, const std::string& body) {
  if (status != 400 && status != 403) return false;
  if (method == "HEAD") return body.empty();
  return body.find("<Code>ExpiredToken</Code>") != std::string::npos ||
         body.find("<Code>TokenRefreshRequired</Code>") != std::string::npos;
}

bool retryable(long status, const std::string& body) {
  if (status >= 500 || status == 429) return true;
  // S3 answers some throttling and timeouts with 400.
  return status == 400 && (body.find("<Code>RequestTimeout</Code>") != std::string::npos ||
                           body.find("<Code>SlowDown</Code>") != std::string::npos ||
                           body.find("<Code>Throttling</Code>") != std::string::npos);
}

// The parts go up as they are given, in any order; the ETags are kept for the completion.
class S3Upload final : public PartUpload {
 public:
  // `client` outlives the upload.
  S3Upload(const S3Client* client, std::string bucket, std::string key)
      : client_(client), bucket_(std::move(bucket)), key_(std::move(key)) {
    upload_id_ = client_->create_multipart(bucket_, key_);
  }
  ~S3Upload() override {
    if (done_) return;
    try {
      client_->abort_multipart(bucket_, key_, upload_id_);
    } catch (const Error&) {
      // The bucket's lifecycle rules remove abandoned parts; nothing else can be done here.
    }
  }
  void put_part(int64_t index, std::vector<std::byte> bytes) override {
    if (index < 0 || index >= client_->max_parts())
      throw IoError(fmt::format("s3://{}/{}: part {} is beyond S3's {} parts", bucket_, key_, index + 1,
                                client_->max_parts()));
    const std::string etag = client_->upload_part(bucket_, key_, upload_id_, static_cast<int>(index + 1), bytes);
    std::lock_guard lock(mu_);
    if (etags_.size() <= static_cast<size_t>(index)) etags_.resize(static_cast<size_t>(index) + 1);
    etags_[static_cast<size_t>(index)] = etag;
  }
  void complete(int64_t count) override {
    std::lock_guard lock(mu_);
    if (static_cast<int64_t>(etags_.size()) != count ||
        std::any_of(etags_.begin(), etags_.end(), [](const std::string& e) { return e.empty(); }))
      throw IoError(fmt::format("s3://{}/{}: completed before its {} parts were all uploaded", bucket_, key_, count));
    client_->complete_multipart(bucket_, key_, upload_id_, etags_);
    done_ = true;
  }

 private:
  const S3Client* client_;
  std::string bucket_, key_, upload_id_;
  std::mutex mu_;
  std::vector<std::string> etags_;
  bool done_ = false;
};

}  // namespace

ObjectListing parse_list_page(std::string_view body, const std::string& where, std::string* next) {
  pugi::xml_document doc;
  if (!doc.load_buffer(body.data(), body.size())) throw IoError(where + ": the server's answer is not XML");
  const pugi::xml_node result = doc.child("ListBucketResult");
  if (!result) throw IoError(where + ": no ListBucketResult in the server's answer");
  ObjectListing out;
  for (pugi::xml_node c : result.children("Contents")) {
    const std::string size_text = c.child_value("Size");
    char* end = nullptr;
    const long long size = std::strtoll(size_text.c_str(), &end, 10);
    if (size_text.empty() || *end != '\0' || size < 0)
      throw IoError(fmt::format("{}: object '{}' has the size '{}'", where, c.child_value("Key"), size_text));
    out.objects.emplace_back(c.child_value("Key"), size);
  }
  for (pugi::xml_node p : result.children("CommonPrefixes")) out.prefixes.emplace_back(p.child_value("Prefix"));
  *next = std::string(result.child_value("IsTruncated")) == "true" ? result.child_value("NextContinuationToken") : "";
  if (std::string(result.child_value("IsTruncated")) == "true" && next->empty())
    throw IoError(where + ": a truncated listing without a continuation token");
  return out;
}

namespace {

// One profile's settings: the credentials file's section first, then the config file's.
struct Profile {
  std::string name;
  std::map<std::string, std::string> credentials, config;

  static Profile read(const std::string& name, const std::string& credentials_file, const std::string& config_file) {
    Profile p;
    p.name = name;
    if (!credentials_file.empty()) p.credentials = ini_section(credentials_file, name);
    if (!config_file.empty()) p.config = ini_section(config_file, name == "default" ? name : "profile " + name);
    return p;
  }
  std::string operator()(const std::string& key) const {
    if (auto it = credentials.find(key); it != credentials.end()) return it->second;
    if (auto it = config.find(key); it != config.end()) return it->second;
    return {};
  }
};

bool is_true(const std::string& v) { return v == "true" || v == "True" || v == "TRUE" || v == "1"; }

std::string sts_endpoint(const std::string& region) {
  std::string sts = env("AWS_ENDPOINT_URL_STS");
  if (sts.empty()) sts = env("AWS_ENDPOINT_URL");
  if (sts.empty()) sts = "https://sts." + region + ".amazonaws.com";
  if (!sts.starts_with("http://") && !sts.starts_with("https://"))
    throw ValueError("the STS endpoint '" + sts + "' is not an http:// or https:// URL");
  while (sts.ends_with('/')) sts.pop_back();
  return sts;
}

std::string session_name(std::string given) {
  return given.empty() ? fmt::format("tessel-{}", std::time(nullptr)) : given;
}

// The profile's fixed keys; null when it has none.
std::shared_ptr<const AwsCredentialSource> profile_keys(const Profile& p) {
  const std::string key = p("aws_access_key_id");
  if (key.empty()) return nullptr;
  if (p("aws_secret_access_key").empty())
    throw ValueError(fmt::format("AWS profile '{}' has aws_access_key_id but no aws_secret_access_key", p.name));
  return AwsCredentialSource::fixed({key, p("aws_secret_access_key"), p("aws_session_token")},
                                    "AWS profile '" + p.name + "'");
}

// A role the profile assumes with another profile's keys (role_arn and source_profile), or with a
// web identity (the environment's AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN first, else the
// profile's web_identity_token_file and role_arn): the SDKs try these before the profile's own keys.
std::shared_ptr<const AwsCredentialSource> assumed_role(const Profile& p, const std::string& credentials_file,
                                                        const std::string& config_file, const std::string& region) {
  const std::string role = p("role_arn");
  if (!role.empty() && !p("source_profile").empty()) {
    const Profile source = Profile::read(p("source_profile"), credentials_file, config_file);
    if (!source("role_arn").empty())
      throw ValueError(fmt::format("AWS profile '{}' takes its keys from profile '{}', which assumes a role itself: "
                                   "role chains are not supported",
                                   p.name, source.name));
    auto keys = profile_keys(source);
    if (!keys)
      throw ValueError(fmt::format("AWS profile '{}' names source_profile '{}', which has no aws_access_key_id",
                                   p.name, source.name));
    return AwsCredentialSource::assume_role(keys->get(), role, session_name(p("role_session_name")), p("external_id"),
                                            sts_endpoint(region), region);
  }
  std::string token_file = env("AWS_WEB_IDENTITY_TOKEN_FILE"), role_arn = env("AWS_ROLE_ARN");
  std::string session = env("AWS_ROLE_SESSION_NAME");
  if (token_file.empty() || role_arn.empty()) {  // one of the two alone is no web identity (the SDKs pass over it)
    token_file = p("web_identity_token_file");
    role_arn = role;
    if (session.empty()) session = p("role_session_name");
  }
  if (!token_file.empty() && !role_arn.empty())
    return AwsCredentialSource::web_identity(token_file, role_arn, session_name(session), sts_endpoint(region));
  if (!role.empty()) {
    throw ValueError(fmt::format("AWS profile '{}' has role_arn but {}", p.name,
                                 p("credential_source").empty()
                                     ? "neither source_profile nor web_identity_token_file"
                                     : "takes its keys from credential_source, which is not supported (use source_profile)"));
  }
  return nullptr;
}

// A container's credentials endpoint, else the EC2 instance metadata service; null when neither.
std::shared_ptr<const AwsCredentialSource> machine_role() {
  std::string container = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  if (std::string relative = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"); !relative.empty())
    container = "http://169.254.170.2" + (relative.starts_with('/') ? relative : "/" + relative);
  if (!container.empty())
    return AwsCredentialSource::container(container, env("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
                                          env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"));
  if (is_true(env("AWS_EC2_METADATA_DISABLED"))) return nullptr;
  std::string imds = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (imds.empty() && on_ec2()) imds = "http://169.254.169.254";
  if (imds.empty()) return nullptr;
  if (!imds.starts_with("http://") && !imds.starts_with("https://"))
    throw ValueError("AWS_EC2_METADATA_SERVICE_ENDPOINT '" + imds + "' is not an http:// or https:// URL");
  while (imds.ends_with('/')) imds.pop_back();
  return AwsCredentialSource::instance_metadata(imds);
}

}  // namespace

S3Config S3Config::from_environment() {
  S3Config c;
  std::string profile_name = env("AWS_PROFILE");
  if (profile_name.empty()) profile_name = "default";
  const std::string credentials_file = home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  const std::string config_file = home_file("AWS_CONFIG_FILE", "config");
  const Profile profile = Profile::read(profile_name, credentials_file, config_file);
  for (const std::string& r : {env("AWS_REGION"), env("AWS_DEFAULT_REGION"), profile("region")}) {
    if (!r.empty()) {
      c.region = r;
      break;
    }
  }
  // The SDKs' order: the environment's keys, a role the profile assumes (with another profile's
  // keys or a web identity), the profile's keys or credential_process, the container's or the
  // instance's role.
  if (std::string key = env("AWS_ACCESS_KEY_ID"); !key.empty()) {
    if (env("AWS_SECRET_ACCESS_KEY").empty()) throw ValueError("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
    c.credentials = AwsCredentialSource::fixed({key, env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN")},
                                               "AWS_ACCESS_KEY_ID");
  }
  if (!c.credentials) c.credentials = assumed_role(profile, credentials_file, config_file, c.region);
  if (!c.credentials) c.credentials = profile_keys(profile);
  if (!c.credentials && !profile("credential_process").empty())
    c.credentials = AwsCredentialSource::process(profile("credential_process"), profile_name);
  if (!c.credentials) {
    // The SDKs would ask SSO before a machine's role: going past it would sign as another identity.
    for (const char* key : {"sso_session", "sso_start_url"}) {
      if (!profile(key).empty())
        throw ValueError(fmt::format("AWS profile '{}' takes its credentials from {}, which tessel does not read: set "
                                     "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN (`aws configure "
                                     "export-credentials --profile {} --format env`)",
                                     profile_name, key, profile_name));
    }
    c.credentials = machine_role();
  }
  c.credentials_hint = fmt::format(
      "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set, profile '{}' has no aws_access_key_id in {} or {}, "
      "and there is no web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN), container credentials endpoint "
      "(AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI) or EC2 instance metadata service "
      "(AWS_EC2_METADATA_SERVICE_ENDPOINT off EC2)",
      profile_name, credentials_file.empty() ? "~/.aws/credentials" : credentials_file,
      config_file.empty() ? "~/.aws/config" : config_file);
  std::string endpoint = env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = profile("endpoint_url");
  if (endpoint.empty()) {
    c.endpoint = "https://s3." + c.region + ".amazonaws.com";
  } else {
    if (!endpoint.starts_with("http://") && !endpoint.starts_with("https://"))
      throw ValueError("the S3 endpoint '" + endpoint + "' is not an http:// or https:// URL");
    while (endpoint.ends_with('/')) endpoint.pop_back();
    c.endpoint = endpoint;
    c.path_style = true;
  }
  if (std::string n = env("TESSEL_S3_MAX_ATTEMPTS"); !n.empty()) c.max_attempts = std::max(1, std::atoi(n.c_str()));
  return c;
}

std::string amz_date_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), out);
  return hex(out, sizeof out);
}

std::string md5_hex(std::span<const std::byte> bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_md5(), nullptr);
  return hex(digest, n);
}

std::string md5_base64(std::span<const std::byte> bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_md5(), nullptr);
  unsigned char out[64];
  const int m = EVP_EncodeBlock(out, digest, static_cast<int>(n));
  return std::string(reinterpret_cast<char*>(out), static_cast<size_t>(m));
}

std::string sigv4_authorization(const SignedRequest& request, const S3Credentials& credentials,
                                const std::string& region, const std::string& service, const std::string& amz_date) {
  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : request.headers) {
    canonical_headers += name + ":" + trim(value) + "\n";
    signed_headers += (signed_headers.empty() ? "" : ";") + name;
  }
  const std::string canonical = request.method + "\n" + request.canonical_uri + "\n" + request.canonical_query + "\n" +
                                canonical_headers + "\n" + signed_headers + "\n" + request.payload_hash;
  const std::string date = amz_date.substr(0, 8);
  const std::string scope = date + "/" + region + "/" + service + "/aws4_request";
  const std::string to_sign = "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope + "\n" + sha256_of(canonical);
  std::string key = hmac("AWS4" + credentials.secret_key, date);
  key = hmac(key, region);
  key = hmac(key, service);
  key = hmac(key, "aws4_request");
  const std::string signature = hmac(key, to_sign);
  return fmt::format("AWS4-HMAC-SHA256 Credential={}/{}, SignedHeaders={}, Signature={}", credentials.access_key, scope,
                     signed_headers, hex(reinterpret_cast<const unsigned char*>(signature.data()), signature.size()));
}

std::shared_ptr<const S3Client> S3Client::current() {
  const std::string fingerprint = configuration_fingerprint(
      {"AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "HOME", "AWS_ACCESS_KEY_ID",
       "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3",
       "AWS_ENDPOINT_URL", "TESSEL_S3_MAX_ATTEMPTS", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
       "AWS_ROLE_SESSION_NAME", "AWS_ENDPOINT_URL_STS", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
       "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
       "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_EC2_METADATA_DISABLED", "AWS_EC2_METADATA_SERVICE_ENDPOINT"},
      {home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), home_file("AWS_CONFIG_FILE", "config")});
  return cached_client<S3Client>(fingerprint, [] { return S3Client(S3Config::from_environment()); });
}

S3Client::Result S3Client::send(const std::string& method, const std::string& bucket, const std::string& key,
                                const std::map<std::string, std::string>& query,
                                std::map<std::string, std::string> headers, std::span<const std::byte> body,
                                std::span<std::byte> into) const {
  if (!config_.credentials) throw IoError(fmt::format("s3://{}/{}: no AWS credentials: {}", bucket, key, config_.credentials_hint));
  S3Credentials credentials = config_.credentials->get();
  bool renewed = false;
  const std::string scheme_end = "://";
  const size_t host_at = config_.endpoint.find(scheme_end) + scheme_end.size();
  std::string host = config_.endpoint.substr(host_at);
  std::string path = "/" + uri_encode(key, true);
  std::string base = config_.endpoint;
  if (config_.path_style || bucket.find('.') != std::string::npos) {
    path = "/" + bucket + (key.empty() ? "" : path);
  } else {
    host = bucket + "." + host;
    base = config_.endpoint.substr(0, host_at) + host;
  }
  std::string canonical_query;
  for (const auto& [name, value] : query) {
    canonical_query += (canonical_query.empty() ? "" : "&") + uri_encode(name, false) + "=" + uri_encode(value, false);
  }
  SignedRequest signed_request{method, path, canonical_query, std::move(headers), "UNSIGNED-PAYLOAD"};
  if (!body.empty() || method == "PUT" || method == "POST") signed_request.payload_hash = sha256_hex(body);
  signed_request.headers["host"] = host;
  signed_request.headers["x-amz-content-sha256"] = signed_request.payload_hash;
  if (!credentials.session_token.empty()) signed_request.headers["x-amz-security-token"] = credentials.session_token;
  Result result;
  result.url = base + path + (canonical_query.empty() ? "" : "?" + canonical_query);
  for (int attempt = 0;; ++attempt) {
    signed_request.headers["x-amz-date"] = amz_date_now();
    HttpRequest request{method, result.url, {}, body};
    for (const auto& [name, value] : signed_request.headers) {
      if (name != "host") request.headers.emplace_back(name, value);
    }
    request.headers.emplace_back("authorization", sigv4_authorization(signed_request, credentials,
                                                                       config_.region, "s3", signed_request.headers["x-amz-date"]));
    const bool last = attempt + 1 >= config_.max_attempts;
    try {
      result.response = http_send(request, into);
    } catch (const HttpTransportError& e) {
      if (last) throw IoError(fmt::format("{} (gave up after {} attempts)", e.what(), attempt + 1));
      back_off(attempt);
      continue;
    }
    if (!renewed && expired_credentials(method, result.response.status, result.response.body) &&
        config_.credentials->renew_after_refusal(credentials.access_key)) {
      renewed = true;  // once: credentials refused again are the store's answer
      credentials = config_.credentials->get();
      if (credentials.session_token.empty()) {
        signed_request.headers.erase("x-amz-security-token");
      } else {
        signed_request.headers["x-amz-security-token"] = credentials.session_token;
      }
      continue;
    }
    if (last || !retryable(result.response.status, result.response.body)) return result;
    back_off(attempt);
  }
}

void S3Client::fail(const Result& r, const std::string& what) const {
  std::string code, message;
  pugi::xml_document doc;
  if (!r.response.body.empty() && doc.load_buffer(r.response.body.data(), r.response.body.size())) {
    code = doc.child("Error").child_value("Code");
    message = doc.child("Error").child_value("Message");
  }
  throw IoError(fmt::format("{}: {} answered HTTP {}{}{}", what, r.url, r.response.status,
                            code.empty() ? "" : " " + code, message.empty() ? "" : " (" + message + ")"));
}

std::optional<int64_t> S3Client::head(const std::string& bucket, const std::string& key) const {
  const Result r = send("HEAD", bucket, key, {}, {}, {});
  if (r.response.status == 404) return std::nullopt;
  if (r.response.status != 200) fail(r, fmt::format("s3://{}/{}", bucket, key));
  const std::string length = r.response.header("content-length");
  char* end = nullptr;
  const long long n = std::strtoll(length.c_str(), &end, 10);
  if (length.empty() || *end != '\0' || n < 0)
    throw IoError(fmt::format("s3://{}/{}: the server gave no object size (Content-Length '{}')", bucket, key, length));
  return n;
}

void S3Client::read(const std::string& bucket, const std::string& key, int64_t offset, std::span<std::byte> out) const {
  if (out.empty()) return;
  const std::string where = fmt::format("s3://{}/{}", bucket, key);
  const int64_t last = offset + static_cast<int64_t>(out.size()) - 1;
  const Result r = send("GET", bucket, key, {}, {{"range", fmt::format("bytes={}-{}", offset, last)}}, {}, out);
  if (r.response.status != 206 && r.response.status != 200 && r.response.status != 416) fail(r, where);
  check_range_response(r.response, where, offset, out.size());
}

std::optional<std::string> S3Client::read_all(const std::string& bucket, const std::string& key, int64_t max_bytes) const {
  const std::string where = fmt::format("s3://{}/{}", bucket, key);
  for (int attempt = 1;; ++attempt) {
    const Result r = send("GET", bucket, key, {}, {}, {});
    if (r.response.status == 404) return std::nullopt;
    if (r.response.status != 200) fail(r, where);
    if (static_cast<int64_t>(r.response.body.size()) > max_bytes)
      throw IoError(fmt::format("{}: more than the {} bytes a metadata object may have", where, max_bytes));
    const std::string length = r.response.header("content-length");
    if (!length.empty() && length != std::to_string(r.response.body.size()))
      throw IoError(fmt::format("{}: truncated: {} bytes received of {}", where, r.response.body.size(), length));
    // An object stored in one PUT has its MD5 as ETag ("<32 hex digits>"); a multipart one has
    // "<hex>-<parts>", which says nothing about the bytes.
    const std::string etag = r.response.header("etag");
    const bool md5_etag = etag.size() == 34 && etag.front() == '"' && etag.back() == '"' &&
                          etag.find_first_not_of("0123456789abcdef", 1) == 33;
    if (!md5_etag) return r.response.body;
    const std::string md5 = md5_hex(std::as_bytes(std::span(r.response.body.data(), r.response.body.size())));
    if (md5 == etag.substr(1, 32)) return r.response.body;
    if (attempt >= config_.max_attempts)
      throw IoError(fmt::format("{}: checksum mismatch: the bytes received have MD5 {}, the object's ETag is {} "
                                "({} attempts)", where, md5, etag, attempt));
    back_off(attempt);
  }
}

ObjectListing S3Client::list(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                         int max_keys) const {
  ObjectListing out;
  std::string token;
  const std::string where = fmt::format("s3://{}/{}", bucket, prefix);
  do {
    std::map<std::string, std::string> query{{"list-type", "2"}, {"prefix", prefix}};
    if (!delimiter.empty()) query["delimiter"] = delimiter;
    if (!token.empty()) query["continuation-token"] = token;
    if (max_keys > 0) query["max-keys"] = std::to_string(max_keys);
    const Result r = send("GET", bucket, "", query, {}, {});
    if (r.response.status != 200) fail(r, "listing " + where);
    append_page(out, parse_list_page(r.response.body, "listing " + where, &token), prefix, "listing " + where);
    if (max_keys > 0) token.clear();
  } while (!token.empty());
  return out;
}

void S3Client::put(const std::string& bucket, const std::string& key, std::span<const std::byte> bytes) const {
  const Result r = send("PUT", bucket, key, {}, {{"content-md5", md5_base64(bytes)}}, bytes);
  if (r.response.status != 200) fail(r, fmt::format("writing s3://{}/{}", bucket, key));
}

void S3Client::remove(const std::string& bucket, const std::string& key) const {
  const Result r = send("DELETE", bucket, key, {}, {}, {});
  if (r.response.status != 204 && r.response.status != 200 && r.response.status != 404)
    fail(r, fmt::format("deleting s3://{}/{}", bucket, key));
}


std::string S3Client::create_multipart(const std::string& bucket, const std::string& key) const {
  const std::string where = fmt::format("starting an upload of s3://{}/{}", bucket, key);
  const Result r = send("POST", bucket, key, {{"uploads", ""}}, {}, {});
  if (r.response.status != 200) fail(r, where);
  pugi::xml_document doc;
  std::string id;
  if (doc.load_buffer(r.response.body.data(), r.response.body.size()))
    id = doc.child("InitiateMultipartUploadResult").child_value("UploadId");
  if (id.empty()) throw IoError(where + ": the server's answer has no UploadId");
  return id;
}

std::string S3Client::upload_part(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                  int part_number, std::span<const std::byte> bytes) const {
  const Result r = send("PUT", bucket, key, {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}},
                        {{"content-md5", md5_base64(bytes)}}, bytes);
  const std::string where = fmt::format("uploading part {} of s3://{}/{}", part_number, bucket, key);
  if (r.response.status != 200) fail(r, where);
  const std::string etag = r.response.header("etag");
  if (etag.empty()) throw IoError(where + ": the server's answer has no ETag");
  return etag;
}

void S3Client::complete_multipart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                               const std::vector<std::string>& etags) const {
  std::string doc = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i)
    doc += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", i + 1, etags[i]);
  doc += "</CompleteMultipartUpload>";
  const auto body = std::as_bytes(std::span(doc.data(), doc.size()));
  const Result r = send("POST", bucket, key, {{"uploadId", upload_id}}, {}, body);
  const std::string where = fmt::format("completing the upload of s3://{}/{}", bucket, key);
  // S3 may answer 200 and still fail: the error document comes in the body.
  if (r.response.status != 200 || r.response.body.find("<Error>") != std::string::npos) fail(r, where);
}

void S3Client::abort_multipart(const std::string& bucket, const std::string& key, const std::string& upload_id) const {
  const Result r = send("DELETE", bucket, key, {{"uploadId", upload_id}}, {}, {});
  if (r.response.status != 204 && r.response.status != 200 && r.response.status != 404)
    fail(r, fmt::format("aborting the upload of s3://{}/{}", bucket, key));
}

std::unique_ptr<PartUpload> S3Client::start_upload(const std::string& bucket, const std::string& key,
                                                   int64_t part_bytes) const {
  if (part_bytes < (int64_t{5} << 20)) throw ValueError("S3 parts are at least 5 MiB");
  return std::make_unique<S3Upload>(this, bucket, key);
}

}  // namespace tessel::detail
