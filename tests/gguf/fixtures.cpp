#include "fixtures.h"

#include <cstring>
#include <limits>

namespace kvtier::gguf::testing {

namespace {
template <typename T>
Array numeric_array(ValueType type, std::initializer_list<T> values) {
  Array a;
  a.elem_type = type;
  a.count = values.size();
  for (T v : values) {
    const size_t at = a.raw.size();
    a.raw.resize(at + sizeof(T));
    std::memcpy(a.raw.data() + at, &v, sizeof(T));
  }
  return a;
}
}  // namespace

Writer all_types_writer(uint32_t alignment) {
  Writer w;
  w.set("general.architecture", Value::string("test"));
  w.set("general.alignment", Value::u32(alignment));
  w.set("t.u8", Value::u8(255));
  w.set("t.i8", Value::i8(-128));
  w.set("t.u16", Value::u16(65535));
  w.set("t.i16", Value::i16(-32768));
  w.set("t.u32", Value::u32(4294967295u));
  w.set("t.i32", Value::i32(std::numeric_limits<int32_t>::min()));
  w.set("t.f32", Value::f32(0.1f));
  w.set("t.f32_tiny", Value::f32(1e-38f));
  w.set("t.bool_true", Value::boolean(true));
  w.set("t.bool_false", Value::boolean(false));
  w.set("t.string", Value::string("h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80\n\ttab"));
  w.set("t.string_empty", Value::string(""));
  w.set("t.u64", Value::u64(std::numeric_limits<uint64_t>::max()));
  w.set("t.i64", Value::i64(std::numeric_limits<int64_t>::min()));
  w.set("t.f64", Value::f64(3.141592653589793));
  w.set("t.arr_u8", Value::array(numeric_array<uint8_t>(ValueType::kU8, {0, 1, 255})));
  w.set("t.arr_i8", Value::array(numeric_array<int8_t>(ValueType::kI8, {-1, 127})));
  w.set("t.arr_u16", Value::array(numeric_array<uint16_t>(ValueType::kU16, {1, 65535})));
  w.set("t.arr_i16", Value::array(numeric_array<int16_t>(ValueType::kI16, {-2, 2})));
  w.set("t.arr_u32", Value::array(numeric_array<uint32_t>(ValueType::kU32, {7, 4000000000u})));
  w.set("t.arr_i32", Value::i32_array({-5, 0, 5}));
  w.set("t.arr_f32", Value::f32_array({0.5f, -1.25f, 3e10f}));
  w.set("t.arr_bool", Value::array(numeric_array<uint8_t>(ValueType::kBool, {1, 0, 1})));
  w.set("t.arr_u64",
        Value::array(numeric_array<uint64_t>(ValueType::kU64, {0, std::numeric_limits<uint64_t>::max()})));
  w.set("t.arr_i64", Value::array(numeric_array<int64_t>(ValueType::kI64, {-9, 9})));
  w.set("t.arr_f64", Value::array(numeric_array<double>(ValueType::kF64, {1e300, -2.5})));
  w.set("t.arr_string", Value::string_array({"a", "", "\xe2\x96\x81piece", "<|special|>"}));
  w.set("t.arr_empty", Value::array(numeric_array<int32_t>(ValueType::kI32, {})));
  Array nested;
  nested.elem_type = ValueType::kArray;
  nested.count = 2;
  nested.arrays.push_back(Value::i32_array({1, 2, 3}));
  nested.arrays.push_back(Value::string_array({"x", "y"}));
  w.set("t.arr_nested", Value::array(std::move(nested)));

  std::vector<float> f(64);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.25f - 3.0f;
  std::vector<uint8_t> fb(f.size() * 4);
  std::memcpy(fb.data(), f.data(), fb.size());
  w.add_tensor_bytes("weights.f32", GgmlType::kF32, {16, 4}, fb);
  std::vector<uint8_t> q(2 * 18);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>(i * 7);
  w.add_tensor_bytes("weights.q4_0", GgmlType::kQ4_0, {64}, q);
  w.add_tensor_bytes("weights.f16_3d", GgmlType::kF16, {3, 2, 2}, std::vector<uint8_t>(24, 0x3c));
  w.add_tensor_bytes("weights.i32_4d", GgmlType::kI32, {1, 2, 1, 3}, std::vector<uint8_t>(24, 1));
  return w;
}

}  // namespace kvtier::gguf::testing
