#include "tessel/checkpoint/detail/io/object_store.h"

#include <sys/stat.h>

#include <cstdlib>

#include "tessel/checkpoint/detail/io/gcs.h"
#include "tessel/checkpoint/detail/io/s3.h"
#include "tessel/core/error.h"
#include "tessel/core/location.h"

namespace tessel::detail {

std::shared_ptr<const ObjectStore> ObjectStore::for_location(const Location& loc) {
  try {
    switch (loc.kind()) {
      case Location::Kind::kS3:
        return S3Client::current();
      case Location::Kind::kGcs:
        return GcsClient::current();
      case Location::Kind::kLocal:
        break;
    }
  } catch (const ValueError& e) {  // a bad endpoint or credentials file: named with the location it stops
    throw ValueError("'" + loc.string() + "': " + e.what());
  }
  throw ValueError("'" + loc.string() + "' is a local path, not a bucket");
}

std::string configuration_fingerprint(std::initializer_list<const char*> variables,
                                      std::initializer_list<std::string> files) {
  std::string out;
  for (const char* name : variables) {
    const char* v = std::getenv(name);
    out += v ? std::string("=") + v : std::string("-");
    out += '\0';
  }
  for (const std::string& file : files) {
    struct stat st {};
    if (!file.empty() && ::stat(file.c_str(), &st) == 0) {
      out += std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
             std::to_string(st.st_mtim.tv_nsec);
    }
    out += '\0';
  }
  return out;
}

void append_page(ObjectListing& out, ObjectListing page, const std::string& prefix, const std::string& where) {
  for (auto& o : page.objects) {
    if (!o.first.starts_with(prefix)) throw IoError(where + ": the server listed '" + o.first + "'");
    out.objects.push_back(std::move(o));
  }
  for (auto& p : page.prefixes) {
    if (!p.starts_with(prefix)) throw IoError(where + ": the server listed '" + p + "'");
    out.prefixes.push_back(std::move(p));
  }
}

void ObjectStore::remove_all(const std::string& bucket, const std::string& prefix) const {
  for (const auto& [key, size] : list(bucket, prefix, "").objects) remove(bucket, key);
}

}  // namespace tessel::detail
