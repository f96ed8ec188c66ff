// The Prometheus text exposition of the server's counters and gauges (/metrics).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "server/scheduler.h"

namespace kvtier::server {

// by_status: HTTP responses by status code.
std::string prometheus_text(const SchedulerStats& s, const std::map<int, uint64_t>& by_status);

}  // namespace kvtier::server
