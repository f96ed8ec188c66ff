#include "gguf_json.h"

#include <fmt/format.h>

namespace kvtier::cli {
namespace {

nlohmann::ordered_json scalar_json(const gguf::Value& v) {
  return std::visit(
      [](const auto& x) -> nlohmann::ordered_json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, gguf::Array>) {
          return nullptr;
        } else {
          return x;
        }
      },
      v.data);
}

nlohmann::ordered_json array_items(const gguf::Array& a) {
  auto items = nlohmann::ordered_json::array();
  for (size_t i = 0; i < a.size(); ++i) {
    switch (a.elem_type) {
      case gguf::ValueType::kString:
        items.push_back(a.strings[i]);
        break;
      case gguf::ValueType::kArray:
        items.push_back(array_items(std::get<gguf::Array>(a.arrays[i].data)));
        break;
      case gguf::ValueType::kBool:
        items.push_back(a.get<uint8_t>(i) != 0);
        break;
      case gguf::ValueType::kF32:
      case gguf::ValueType::kF64:
        items.push_back(a.get<double>(i));
        break;
      case gguf::ValueType::kU64:
        items.push_back(a.get<uint64_t>(i));
        break;
      default:
        items.push_back(*a.get_int(i));
        break;
    }
  }
  return items;
}

// Quoted, with control characters escaped and long strings cut (the full text is in --json).
std::string quoted(const std::string& s, size_t max_len = 160) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "\"";
  if (s.size() > max_len) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

std::string scalar_text(const gguf::Value& v) {
  if (const auto* s = v.as_string()) return quoted(*s);
  if (auto b = v.as_bool()) return *b ? "true" : "false";
  if (const auto* d = std::get_if<double>(&v.data)) {
    return v.type == gguf::ValueType::kF32 ? fmt::format("{}", static_cast<float>(*d))
                                           : fmt::format("{}", *d);
  }
  if (const auto* u = std::get_if<uint64_t>(&v.data)) return fmt::format("{}", *u);
  return fmt::format("{}", std::get<int64_t>(v.data));
}

}  // namespace

nlohmann::ordered_json value_to_json(const gguf::Value& v) {
  nlohmann::ordered_json j;
  j["type"] = std::string(gguf::value_type_name(v.type));
  if (const auto* a = v.as_array()) {
    j["elem_type"] = std::string(gguf::value_type_name(a->elem_type));
    j["value"] = array_items(*a);
  } else {
    j["value"] = scalar_json(v);
  }
  return j;
}

std::string value_to_text(const gguf::Value& v, size_t max_items) {
  const auto* a = v.as_array();
  if (a == nullptr) return scalar_text(v);
  std::string out = fmt::format("[{} x {}] [", a->size(), gguf::value_type_name(a->elem_type));
  const size_t n = std::min(a->size(), max_items);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += ", ";
    switch (a->elem_type) {
      case gguf::ValueType::kString:
        out += quoted(a->strings[i], 40);
        break;
      case gguf::ValueType::kArray:
        out += value_to_text(a->arrays[i], 3);
        break;
      case gguf::ValueType::kF32:
      case gguf::ValueType::kF64:
        out += fmt::format("{}", a->get<double>(i));
        break;
      case gguf::ValueType::kU64:
        out += fmt::format("{}", a->get<uint64_t>(i));
        break;
      case gguf::ValueType::kBool:
        out += a->get<uint8_t>(i) ? "true" : "false";
        break;
      default:
        out += fmt::format("{}", *a->get_int(i));
        break;
    }
  }
  if (a->size() > n) out += ", ...";
  out += "]";
  return out;
}

}  // namespace kvtier::cli
