#include "tessel/core/dtype.h"

#include <array>
#include <string>

#include "tessel/core/error.h"

namespace tessel {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::string_view short_name;
  size_t size;
  std::string_view typestr;
  bool floating;
};

constexpr std::array<DTypeInfo, 15> kInfo = {{
    {DType::kBool, "bool", "bool", 1, "|b1", false},
    {DType::kU8, "uint8", "u8", 1, "|u1", false},
    {DType::kI8, "int8", "i8", 1, "|i1", false},
    {DType::kI16, "int16", "i16", 2, "<i2", false},
    {DType::kU16, "uint16", "u16", 2, "<u2", false},
    {DType::kI32, "int32", "i32", 4, "<i4", false},
    {DType::kU32, "uint32", "u32", 4, "<u4", false},
    {DType::kI64, "int64", "i64", 8, "<i8", false},
    {DType::kU64, "uint64", "u64", 8, "<u8", false},
    {DType::kF16, "float16", "f16", 2, "<f2", true},
    {DType::kBF16, "bfloat16", "bf16", 2, "bfloat16", true},
    {DType::kF32, "float32", "f32", 4, "<f4", true},
    {DType::kF64, "float64", "f64", 8, "<f8", true},
    {DType::kF8E4M3FN, "float8_e4m3fn", "f8e4m3fn", 1, "float8_e4m3fn", true},
    {DType::kF8E5M2, "float8_e5m2", "f8e5m2", 1, "float8_e5m2", true},
}};

constexpr std::array<DType, 15> kAll = {DType::kBool, DType::kU8,  DType::kI8,  DType::kI16,      DType::kU16,
                                        DType::kI32,  DType::kU32, DType::kI64, DType::kU64,      DType::kF16,
                                        DType::kBF16, DType::kF32, DType::kF64, DType::kF8E4M3FN, DType::kF8E5M2};

const DTypeInfo& info(DType dtype) {
  for (const auto& i : kInfo)
    if (i.dtype == dtype) return i;
  throw ValueError("invalid DType value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

std::span<const DType> all_dtypes() { return kAll; }
std::string_view name(DType dtype) { return info(dtype).name; }
std::string_view short_name(DType dtype) { return info(dtype).short_name; }
size_t item_size(DType dtype) { return info(dtype).size; }
std::string_view numpy_typestr(DType dtype) { return info(dtype).typestr; }
std::string_view zarr3_data_type(DType dtype) { return info(dtype).name; }
bool is_floating(DType dtype) { return info(dtype).floating; }

DType parse_dtype(std::string_view text) {
  for (const auto& i : kInfo) {
    if (text == i.name || text == i.short_name || text == i.typestr) return i.dtype;
    // numpy accepts any byte-order mark for a numeric code: '<' little, '=' native
    // (little on every platform we build for), '|' not applicable (1-byte types).
    if (text.size() == 3 && i.typestr.size() == 3 && text.substr(1) == i.typestr.substr(1)) {
      if (text[0] == '<' || text[0] == '=' || text[0] == '|') return i.dtype;
      if (text[0] == '>' && i.size > 1)
        throw ValueError("dtype '" + std::string(text) + "' is big-endian; only little-endian data is supported");
      if (text[0] == '>') return i.dtype;
    }
  }
  throw ValueError("unknown dtype '" + std::string(text) +
                   "' (expected one of bool, uint8, int8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, "
                   "float32, float64, float8_e4m3fn, float8_e5m2, their short names such as f32, or numpy codes such as <f4)");
}

}  // namespace tessel
