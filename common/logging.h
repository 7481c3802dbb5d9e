// Logging setup: spdlog to stderr with a daemon-specific prefix.
#pragma once
#include <spdlog/spdlog.h>

#include <string>

namespace tessera {
// level: trace|debug|info|warn|error
void InitLogging(const std::string& name, const std::string& level = "info");
}  // namespace tessera
