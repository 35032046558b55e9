// Logging set-up shared by the tools: spdlog on stderr, level from -v / -q.
#ifndef SOAP_SUPPORT_LOGGING_H
#define SOAP_SUPPORT_LOGGING_H

#include <spdlog/spdlog.h>

namespace soap {

/// verbosity: -1 quiet (errors only), 0 warnings, 1 info (-v), 2+ debug (-vv).
void setupLogging(int verbosity);

} // namespace soap

#endif // SOAP_SUPPORT_LOGGING_H
