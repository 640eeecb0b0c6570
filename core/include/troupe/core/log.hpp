#pragma once
/// @file
/// Logging through spdlog. The level comes from `TROUPE_LOG_LEVEL`
/// (trace, debug, info, warn, error, critical, off; default info).

#include <spdlog/logger.h>

namespace troupe {

/// The process-wide troupe logger (thread-safe, writes to stderr).
spdlog::logger& log();

}  // namespace troupe
