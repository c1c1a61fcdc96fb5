#include "tessel/checkpoint/codec.h"

#include <blosc.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <charconv>
#include <cstring>

#include "tessel/core/error.h"

namespace tessel {

Compression Compression::parse(std::string_view text) {
  if (text == "none") return none();
  if (text == "zstd") return zstd();
  if (text.starts_with("zstd:")) {
    std::string_view digits = text.substr(5);
    int level = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), level);
    if (ec == std::errc() && end == digits.data() + digits.size() && level >= ZSTD_minCLevel() &&
        level <= ZSTD_maxCLevel() && level != 0) {
      return zstd(level);
    }
    throw ValueError("compression '" + std::string(text) + "': the zstd level must be an integer in [" +
                     std::to_string(ZSTD_minCLevel()) + ", " + std::to_string(ZSTD_maxCLevel()) +
                     "], not 0");
  }
  throw ValueError("unknown compression '" + std::string(text) +
                   "': expected none, zstd or zstd:<level>");
}

std::string Compression::to_string() const {
  switch (kind) {
    case Kind::kNone: return "none";
    case Kind::kZstd: return "zstd:" + std::to_string(level);
    case Kind::kBlosc: return "blosc";
  }
  return "?";
}

std::vector<std::byte> compress(const Compression& compression, std::span<const std::byte> raw) {
  switch (compression.kind) {
    case Compression::Kind::kNone:
      return {raw.begin(), raw.end()};
    case Compression::Kind::kZstd: {
      std::vector<std::byte> out(ZSTD_compressBound(raw.size()));
      size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), compression.level);
      if (ZSTD_isError(n)) throw ValueError(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
      out.resize(n);
      return out;
    }
    case Compression::Kind::kBlosc:
      break;
  }
  throw ValueError("tessel does not write blosc chunks; use none or zstd");
}

namespace {

void decode_zstd(std::span<const std::byte> in, std::span<std::byte> out, std::string_view what) {
  const unsigned long long declared = ZSTD_getFrameContentSize(in.data(), in.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR) {
    throw ValueError(std::string(what) + ": not a zstd frame (" + std::to_string(in.size()) + " bytes)");
  }
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != out.size()) {
    throw ValueError(std::string(what) + ": the zstd frame holds " + std::to_string(declared) +
                     " bytes, the chunk has " + std::to_string(out.size()));
  }
  // The one-shot call also handles frames without a content size, given enough room; several
  // concatenated frames are decoded in turn, as a zstd stream allows.
  thread_local struct Ctx {
    ZSTD_DCtx* p = ZSTD_createDCtx();
    ~Ctx() { ZSTD_freeDCtx(p); }
  } ctx;
  size_t n = ZSTD_decompressDCtx(ctx.p, out.data(), out.size(), in.data(), in.size());
  if (ZSTD_isError(n)) {
    const bool too_big = ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall;
    throw ValueError(std::string(what) + (too_big ? ": the zstd data decodes to more than the chunk's " +
                                                        std::to_string(out.size()) + " bytes"
                                                  : std::string(": corrupt zstd data (") +
                                                        ZSTD_getErrorName(n) + ")"));
  }
  if (n != out.size()) {
    throw ValueError(std::string(what) + ": the zstd data decodes to " + std::to_string(n) +
                     " bytes, the chunk has " + std::to_string(out.size()));
  }
}

void decode_blosc(std::span<const std::byte> in, std::span<std::byte> out, std::string_view what) {
  size_t nbytes = 0;
  if (in.size() < BLOSC_MIN_HEADER_LENGTH || blosc_cbuffer_validate(in.data(), in.size(), &nbytes) != 0) {
    throw ValueError(std::string(what) + ": not a valid blosc buffer (" + std::to_string(in.size()) + " bytes)");
  }
  if (nbytes != out.size()) {
    throw ValueError(std::string(what) + ": the blosc buffer holds " + std::to_string(nbytes) +
                     " bytes, the chunk has " + std::to_string(out.size()));
  }
  int n = blosc_decompress_ctx(in.data(), out.data(), out.size(), 1);
  if (n < 0 || static_cast<size_t>(n) != out.size()) {
    throw ValueError(std::string(what) + ": corrupt blosc data (error " + std::to_string(n) + ")");
  }
}

}  // namespace

void decompress(const Compression& compression, std::span<const std::byte> encoded,
                std::span<std::byte> out, std::string_view what) {
  switch (compression.kind) {
    case Compression::Kind::kNone:
      if (encoded.size() != out.size()) {
        throw ValueError(std::string(what) + ": " + std::to_string(encoded.size()) +
                         " bytes, an uncompressed chunk has " + std::to_string(out.size()));
      }
      if (!out.empty()) std::memcpy(out.data(), encoded.data(), out.size());
      return;
    case Compression::Kind::kZstd:
      return decode_zstd(encoded, out, what);
    case Compression::Kind::kBlosc:
      return decode_blosc(encoded, out, what);
  }
}

}  // namespace tessel
