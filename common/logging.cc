#include "common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace tessera {
void InitLogging(const std::string& name, const std::string& level) {
  auto logger = spdlog::stderr_logger_mt(name + "-" + std::to_string(reinterpret_cast<uintptr_t>(&name)));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ " + name + " %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::flush_on(spdlog::level::info);
}
}  // namespace tessera
