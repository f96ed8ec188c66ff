// GGUF metadata values as JSON: {"type": "u32", "value": 42}; arrays carry "elem_type" and a list.
#pragma once

#include <nlohmann/json.hpp>

#include "gguf/value.h"

namespace kvtier::cli {

nlohmann::ordered_json value_to_json(const gguf::Value& v);
// One-line human rendering; arrays show their first `max_items` elements.
std::string value_to_text(const gguf::Value& v, size_t max_items = 8);

}  // namespace kvtier::cli
