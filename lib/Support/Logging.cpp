// Logging set-up: one stderr sink, no colours when stderr is not a terminal.
#include "soap/Support/Logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace soap {

void setupLogging(int verbosity) {
  auto logger = spdlog::stderr_color_mt("soap");
  logger->set_pattern("%^%l%$: %v");
  spdlog::level::level_enum level = spdlog::level::warn;
  if (verbosity < 0)
    level = spdlog::level::err;
  else if (verbosity == 1)
    level = spdlog::level::info;
  else if (verbosity >= 2)
    level = spdlog::level::debug;
  logger->set_level(level);
  spdlog::set_default_logger(logger);
}

} // namespace soap
