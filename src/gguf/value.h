// GGUF metadata values: the 13 value types of the format, arrays of any of them (nested too).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/error.h"

namespace kvtier::gguf {

enum class ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

std::optional<ValueType> value_type_from_id(uint32_t id);
std::string_view value_type_name(ValueType t);
// Bytes of one element of a fixed-size type (0 for string and array).
size_t value_type_size(ValueType t);
bool is_integer_type(ValueType t);
bool is_float_type(ValueType t);

struct Value;

struct Array {
  ValueType elem_type = ValueType::kU8;
  uint64_t count = 0;
  std::vector<uint8_t> raw;          // fixed-size elements, little-endian: [count * value_type_size] bytes
  std::vector<std::string> strings;  // when elem_type == kString: [count]
  std::vector<Value> arrays;         // when elem_type == kArray: [count], each an array

  size_t size() const { return static_cast<size_t>(count); }
  // Element i of a fixed-size numeric (or bool) array, converted to T.
  template <typename T>
  T get(size_t i) const;
  std::optional<int64_t> get_int(size_t i) const;  // integer element types only
  double get_float(size_t i) const;                // any numeric element type
};

struct Value {
  ValueType type = ValueType::kU8;
  // kU8..kU64 -> uint64_t, kI8..kI64 -> int64_t, kF32/kF64 -> double, kBool -> bool,
  // kString -> std::string, kArray -> Array.
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;

  static Value u8(uint8_t v) { return {ValueType::kU8, uint64_t{v}}; }
  static Value u16(uint16_t v) { return {ValueType::kU16, uint64_t{v}}; }
  static Value u32(uint32_t v) { return {ValueType::kU32, uint64_t{v}}; }
  static Value u64(uint64_t v) { return {ValueType::kU64, v}; }
  static Value i8(int8_t v) { return {ValueType::kI8, int64_t{v}}; }
  static Value i16(int16_t v) { return {ValueType::kI16, int64_t{v}}; }
  static Value i32(int32_t v) { return {ValueType::kI32, int64_t{v}}; }
  static Value i64(int64_t v) { return {ValueType::kI64, v}; }
  static Value f32(float v) { return {ValueType::kF32, double{v}}; }
  static Value f64(double v) { return {ValueType::kF64, v}; }
  static Value boolean(bool v) { return {ValueType::kBool, v}; }
  static Value string(std::string v) { return {ValueType::kString, std::move(v)}; }
  static Value array(Array a) { return {ValueType::kArray, std::move(a)}; }
  static Value string_array(std::vector<std::string> v);
  static Value f32_array(const std::vector<float>& v);
  static Value i32_array(const std::vector<int32_t>& v);

  // Integer value of any integer type, if it fits in int64.
  std::optional<int64_t> as_int() const;
  // Numeric value of any integer or float type.
  std::optional<double> as_number() const;
  const std::string* as_string() const { return std::get_if<std::string>(&data); }
  const Array* as_array() const { return std::get_if<Array>(&data); }
  std::optional<bool> as_bool() const;
};

template <typename T>
T Array::get(size_t i) const {
  KVTIER_ASSERT(i < count, "array index {} of {}", i, count);
  const uint8_t* p = raw.data() + i * value_type_size(elem_type);
  switch (elem_type) {
#define KVTIER_GGUF_CASE(tag, ctype) \
  case ValueType::tag: {             \
    ctype v;                         \
    std::memcpy(&v, p, sizeof v);    \
    return static_cast<T>(v);        \
  }
    KVTIER_GGUF_CASE(kU8, uint8_t)
    KVTIER_GGUF_CASE(kI8, int8_t)
    KVTIER_GGUF_CASE(kU16, uint16_t)
    KVTIER_GGUF_CASE(kI16, int16_t)
    KVTIER_GGUF_CASE(kU32, uint32_t)
    KVTIER_GGUF_CASE(kI32, int32_t)
    KVTIER_GGUF_CASE(kF32, float)
    KVTIER_GGUF_CASE(kU64, uint64_t)
    KVTIER_GGUF_CASE(kI64, int64_t)
    KVTIER_GGUF_CASE(kF64, double)
#undef KVTIER_GGUF_CASE
    case ValueType::kBool:
      return static_cast<T>(*p != 0);
    default:
      KVTIER_ASSERT(false, "get<T> on an array of {}", value_type_name(elem_type));
  }
  __builtin_unreachable();
}

}  // namespace kvtier::gguf
