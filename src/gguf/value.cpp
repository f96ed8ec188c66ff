#include "gguf/value.h"

#include <limits>

namespace kvtier::gguf {

std::optional<ValueType> value_type_from_id(uint32_t id) {
  if (id > static_cast<uint32_t>(ValueType::kF64)) return std::nullopt;
  return static_cast<ValueType>(id);
}

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kU8:
      return "u8";
    case ValueType::kI8:
      return "i8";
    case ValueType::kU16:
      return "u16";
    case ValueType::kI16:
      return "i16";
    case ValueType::kU32:
      return "u32";
    case ValueType::kI32:
      return "i32";
    case ValueType::kF32:
      return "f32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kU64:
      return "u64";
    case ValueType::kI64:
      return "i64";
    case ValueType::kF64:
      return "f64";
  }
  return "?";
}

size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kBool:
      return 1;
    case ValueType::kU16:
    case ValueType::kI16:
      return 2;
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kF32:
      return 4;
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kF64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      return 0;
  }
  return 0;
}

bool is_integer_type(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kU16:
    case ValueType::kI16:
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kU64:
    case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

bool is_float_type(ValueType t) {
  return t == ValueType::kF32 || t == ValueType::kF64;
}

std::optional<int64_t> Array::get_int(size_t i) const {
  if (!is_integer_type(elem_type)) return std::nullopt;
  if (elem_type == ValueType::kU64) {
    const auto v = get<uint64_t>(i);
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  return get<int64_t>(i);
}

double Array::get_float(size_t i) const {
  return get<double>(i);
}

Value Value::string_array(std::vector<std::string> v) {
  Array a;
  a.elem_type = ValueType::kString;
  a.count = v.size();
  a.strings = std::move(v);
  return array(std::move(a));
}

Value Value::f32_array(const std::vector<float>& v) {
  Array a;
  a.elem_type = ValueType::kF32;
  a.count = v.size();
  a.raw.resize(v.size() * 4);
  if (!v.empty()) std::memcpy(a.raw.data(), v.data(), a.raw.size());
  return array(std::move(a));
}

Value Value::i32_array(const std::vector<int32_t>& v) {
  Array a;
  a.elem_type = ValueType::kI32;
  a.count = v.size();
  a.raw.resize(v.size() * 4);
  if (!v.empty()) std::memcpy(a.raw.data(), v.data(), a.raw.size());
  return array(std::move(a));
}

std::optional<int64_t> Value::as_int() const {
  if (const auto* u = std::get_if<uint64_t>(&data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&data)) return *i;
  return std::nullopt;
}

std::optional<double> Value::as_number() const {
  if (const auto* u = std::get_if<uint64_t>(&data)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&data)) return static_cast<double>(*i);
  if (const auto* f = std::get_if<double>(&data)) return *f;
  return std::nullopt;
}

std::optional<bool> Value::as_bool() const {
  if (const auto* b = std::get_if<bool>(&data)) return *b;
  return std::nullopt;
}

}  // namespace kvtier::gguf
