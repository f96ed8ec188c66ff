// The results as JSON: run metadata, every sample, and the cells per depth, per length and overall.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "eval/results.h"

namespace kvtier::eval {

nlohmann::json results_json(const RunInfo& info, const Results& r);
void write_json_file(const std::string& path, const nlohmann::json& j);

}  // namespace kvtier::eval
