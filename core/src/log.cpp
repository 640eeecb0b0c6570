#include "troupe/core/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace troupe {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  auto logger = spdlog::stderr_color_mt("troupe");
  logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] [troupe] %v");
  logger->set_level(spdlog::level::info);
  if (const char* env = std::getenv("TROUPE_LOG_LEVEL"); env && *env) {
    auto level = spdlog::level::from_str(env);
    // from_str maps unknown names to "off"; only accept "off" when it was asked for.
    if (level == spdlog::level::off && std::string(env) != "off") {
      logger->warn("TROUPE_LOG_LEVEL='{}' is not a level (use trace, debug, info, warn, error, "
                   "critical or off); keeping info", env);
    } else {
      logger->set_level(level);
    }
  }
  return logger;
}

}  // namespace

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

}  // namespace troupe
