#include "tessel/runtime/detail/kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/core/half.h"
#include "tessel/detail/vector_clones.h"

namespace tessel::detail {
namespace {

// Per dtype: the stored type S, the type arithmetic runs in (Acc), and the conversions.
template <class S, class A = S>
struct Plain {
  using Storage = S;
  using Acc = A;
  static Acc load(S v) { return static_cast<Acc>(v); }
  static S store(Acc a) { return static_cast<S>(a); }
};
struct Bool : Plain<uint8_t> {
  static uint8_t store(uint8_t a) { return a != 0; }
};
struct F16 {
  using Storage = uint16_t;
  using Acc = float;
  static float load(uint16_t v) { return f16_to_f32(v); }
  static uint16_t store(float a) { return f32_to_f16(a); }
};
struct BF16 {
  using Storage = uint16_t;
  using Acc = float;
  static float load(uint16_t v) { return bf16_to_f32(v); }
  static uint16_t store(float a) { return f32_to_bf16(a); }
};

struct F8E4M3FN {
  using Storage = uint8_t;
  using Acc = float;
  static float load(uint8_t v) { return f8e4m3fn_to_f32(v); }
  static uint8_t store(float a) { return f32_to_f8e4m3fn(a); }
};
struct F8E5M2 {
  using Storage = uint8_t;
  using Acc = float;
  static float load(uint8_t v) { return f8e5m2_to_f32(v); }
  static uint8_t store(float a) { return f32_to_f8e5m2(a); }
};

template <class Fn>
void dispatch(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kBool: return fn(Bool{});
    case DType::kU8: return fn(Plain<uint8_t>{});
    case DType::kI8: return fn(Plain<int8_t>{});
    case DType::kI32: return fn(Plain<int32_t>{});
    case DType::kI64: return fn(Plain<int64_t>{});
    case DType::kI16: return fn(Plain<int16_t>{});
    case DType::kU16: return fn(Plain<uint16_t>{});
    case DType::kU32: return fn(Plain<uint32_t>{});
    case DType::kU64: return fn(Plain<uint64_t>{});
    case DType::kF16: return fn(F16{});
    case DType::kBF16: return fn(BF16{});
    case DType::kF32: return fn(Plain<float>{});
    case DType::kF64: return fn(Plain<double>{});
    case DType::kF8E4M3FN: return fn(F8E4M3FN{});
    case DType::kF8E5M2: return fn(F8E5M2{});
  }
  throw ValueError(fmt::format("unknown dtype code {}", static_cast<int>(dtype)));
}

template <class A>
A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;  // integer sums wrap, as XLA's do
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
// NaN wins, as jnp.maximum / jnp.minimum.
template <class A>
A max(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return a < b ? b : a;
}
template <class A>
A min(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return b < a ? b : a;
}

// f64 -> f32 rounding to odd: a following round-to-nearest-even to 16 bits is then the correctly
// rounded f64 -> f16/bf16 (no double rounding), since f32 keeps more than 2 extra bits.
float to_f32_odd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  auto bits = std::bit_cast<uint32_t>(f);
  if (bits & 1u) return f;
  bits = std::fabs(static_cast<double>(f)) > std::fabs(d) ? bits - 1 : bits + 1;
  return std::bit_cast<float>(bits);
}

bool integer_like(DType t) { return !is_floating(t); }

template <class To>
To from_double(double d) {
  if constexpr (std::is_same_v<To, double>) {
    return d;
  } else if constexpr (std::is_same_v<To, float>) {
    return static_cast<float>(d);
  } else {
    if (std::isnan(d)) return 0;
    if (d <= static_cast<double>(std::numeric_limits<To>::lowest())) return std::numeric_limits<To>::lowest();
    if (d >= static_cast<double>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  }
}

// Store a double into dtype `to` at dst[i].
void store(DType to, double d, std::byte* dst, int64_t i) {
  auto put = [&](auto v) { std::memcpy(dst + i * static_cast<int64_t>(sizeof(v)), &v, sizeof(v)); };
  switch (to) {
    case DType::kBool: return put(static_cast<uint8_t>(d != 0));
    case DType::kU8: return put(from_double<uint8_t>(d));
    case DType::kI8: return put(from_double<int8_t>(d));
    case DType::kI32: return put(from_double<int32_t>(d));
    case DType::kI64: return put(from_double<int64_t>(d));
    case DType::kI16: return put(from_double<int16_t>(d));
    case DType::kU16: return put(from_double<uint16_t>(d));
    case DType::kU32: return put(from_double<uint32_t>(d));
    case DType::kU64: return put(from_double<uint64_t>(d));
    case DType::kF16: return put(f32_to_f16(to_f32_odd(d)));
    case DType::kBF16: return put(f32_to_bf16(to_f32_odd(d)));
    case DType::kF32: return put(static_cast<float>(d));
    case DType::kF64: return put(d);
    case DType::kF8E4M3FN: return put(f32_to_f8e4m3fn(to_f32_odd(d)));
    case DType::kF8E5M2: return put(f32_to_f8e5m2(to_f32_odd(d)));
  }
}

// The f32 sum (or mean) of `n` inputs, the hot reduction of gradients: each element added up over
// the inputs in order as the general loop does (the same bits), 16 elements at a time in registers
// rather than through an accumulator in memory. Two 8-lane vectors, not one 16-lane one: g++ keeps
// a 16-lane generic vector on the stack when the clone has only 256-bit registers (AVX2), which ran
// the all_reduce at a third of the memory's speed.
using Floats8 = float __attribute__((vector_size(32)));

TESSEL_VECTOR_CLONES void sum_f32(const float* const* in, size_t n, float* out, int64_t count, bool mean) {
  const auto divisor = static_cast<float>(n);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    Floats8 lo, hi, v, w;
    std::memcpy(&lo, in[0] + i, sizeof lo);
    std::memcpy(&hi, in[0] + i + 8, sizeof hi);
    for (size_t k = 1; k < n; ++k) {
      std::memcpy(&v, in[k] + i, sizeof v);
      std::memcpy(&w, in[k] + i + 8, sizeof w);
      lo += v;
      hi += w;
    }
    if (mean) {
      lo /= divisor;
      hi /= divisor;
    }
    std::memcpy(out + i, &lo, sizeof lo);
    std::memcpy(out + i + 8, &hi, sizeof hi);
  }
  for (; i < count; ++i) {
    float acc = in[0][i];
    for (size_t k = 1; k < n; ++k) acc += in[k][i];
    out[i] = mean ? acc / divisor : acc;
  }
}

}  // namespace

void check_reduction(DType dtype, Reduction op) {
  if (dtype == DType::kBool && (op == Reduction::kSum || op == Reduction::kMean))
    throw ValueError(fmt::format("{} of bool is not defined: use max (or) or min (and)", name(op)));
  if (op == Reduction::kMean && !is_floating(dtype))
    throw ValueError(fmt::format("mean of {} is not defined: cast to a float type first", name(dtype)));
}

void reduce_run(DType dtype, Reduction op, const std::byte* const* inputs, size_t num_inputs,
                std::byte* dst, int64_t count) {
  if (dtype == DType::kF32 && (op == Reduction::kSum || op == Reduction::kMean))
    return sum_f32(reinterpret_cast<const float* const*>(inputs), num_inputs, reinterpret_cast<float*>(dst), count,
                   op == Reduction::kMean);
  dispatch(dtype, [&](auto traits) {
    using T = decltype(traits);
    using S = typename T::Storage;
    using A = typename T::Acc;
    constexpr int64_t kChunk = 2048;
    A acc[kChunk];
    for (int64_t base = 0; base < count; base += kChunk) {
      const int64_t m = std::min(kChunk, count - base);
      const S* in0 = reinterpret_cast<const S*>(inputs[0]) + base;
      for (int64_t i = 0; i < m; ++i) acc[i] = T::load(in0[i]);
      for (size_t k = 1; k < num_inputs; ++k) {
        const S* in = reinterpret_cast<const S*>(inputs[k]) + base;
        switch (op) {
          case Reduction::kSum:
          case Reduction::kMean:
            for (int64_t i = 0; i < m; ++i) acc[i] = add<A>(acc[i], T::load(in[i]));
            break;
          case Reduction::kMax:
            for (int64_t i = 0; i < m; ++i) acc[i] = max<A>(acc[i], T::load(in[i]));
            break;
          case Reduction::kMin:
            for (int64_t i = 0; i < m; ++i) acc[i] = min<A>(acc[i], T::load(in[i]));
            break;
        }
      }
      if constexpr (std::is_floating_point_v<A>)
        if (op == Reduction::kMean)
          for (int64_t i = 0; i < m; ++i) acc[i] /= static_cast<A>(num_inputs);
      S* out = reinterpret_cast<S*>(dst) + base;
      for (int64_t i = 0; i < m; ++i) out[i] = T::store(acc[i]);
    }
  });
}

void convert_run(DType from, const std::byte* src, DType to, std::byte* dst, int64_t count) {
  if (count <= 0) return;
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(count) * item_size(from));
    return;
  }
  dispatch(from, [&](auto traits) {
    using T = decltype(traits);
    using S = typename T::Storage;
    const S* in = reinterpret_cast<const S*>(src);
    if (integer_like(from) && integer_like(to)) {
      for (int64_t i = 0; i < count; ++i) {
        auto v = static_cast<int64_t>(in[i]);
        switch (to) {
          case DType::kBool: dst[i] = std::byte{v != 0}; break;
          case DType::kU8: dst[i] = static_cast<std::byte>(static_cast<uint8_t>(v)); break;
          case DType::kI8: dst[i] = static_cast<std::byte>(static_cast<uint8_t>(v)); break;
          case DType::kI32: reinterpret_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v); break;
          default: reinterpret_cast<int64_t*>(dst)[i] = v; break;
        }
      }
      return;
    }
    if (to == DType::kBF16 && from == DType::kF32) {  // the hot pair: no detour through double
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < count; ++i) out[i] = f32_to_bf16(static_cast<float>(T::load(in[i])));
      return;
    }
    for (int64_t i = 0; i < count; ++i) store(to, static_cast<double>(T::load(in[i])), dst, i);
  });
}

void stream_copy(std::byte* dst, const std::byte* src, size_t bytes) {
#if defined(__x86_64__)
  constexpr size_t kLine = 64;
  // Ordinary stores up to the first whole line of dst, streaming stores of whole lines, the rest
  // ordinary again: a line written in part by streaming stores would cost a partial write.
  const size_t head = std::min(bytes, (kLine - reinterpret_cast<uintptr_t>(dst) % kLine) % kLine);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + kLine <= bytes; i += kLine) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1), c = _mm_loadu_si128(s + 2),
                  e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace tessel::detail
