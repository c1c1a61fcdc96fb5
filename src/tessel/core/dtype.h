// Element types of arrays, with the names JAX, numpy/zarr v2 and zarr v3 use for them.
//
//   tessel::DType t = tessel::parse_dtype("bfloat16");
//   item_size(t) == 2; numpy_typestr(t) == "bfloat16"; short_name(t) == "bf16"
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace tessel {

// The later widths were added after the first nine; the order carries no meaning. The float8 types
// are ml_dtypes' (JAX's) float8_e4m3fn and float8_e5m2.
enum class DType : uint8_t {
  kBool, kU8, kI8, kI32, kI64, kF16, kBF16, kF32, kF64, kI16, kU16, kU32, kU64, kF8E4M3FN, kF8E5M2
};

// Every DType, in declaration order.
std::span<const DType> all_dtypes();

// JAX / numpy name: "float32", "bfloat16", "int32", "bool", ...
std::string_view name(DType dtype);
// Short name used on the command line and in plans: "f32", "bf16", "i32", "bool", ...
std::string_view short_name(DType dtype);
// Bytes per element.
size_t item_size(DType dtype);
// zarr v2 `dtype` string as TensorStore writes it: "<f4", "|b1", and "bfloat16" (no numpy code).
std::string_view numpy_typestr(DType dtype);
// zarr v3 `data_type`: the TensorStore names, equal to name().
std::string_view zarr3_data_type(DType dtype);
bool is_floating(DType dtype);

// Accepts name(), short_name() and numpy_typestr() spellings (also "=f4" style native order and
// "<u1"/"|u1" variants). Throws ValueError naming the text for anything else, big-endian included.
DType parse_dtype(std::string_view text);

}  // namespace tessel
