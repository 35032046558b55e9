// The benches' command lines: an argument a bench does not know (--help
// included) prints its usage and exits (2; 0 for --help) before anything is
// measured or any result file is written.
#ifndef SOAP_BENCH_BENCHARGS_H
#define SOAP_BENCH_BENCHARGS_H

#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

namespace soap {

[[noreturn]] inline void benchUsage(const char *usage, const char *arg) {
  bool help = !std::strcmp(arg, "--help") || !std::strcmp(arg, "-h");
  if (!help)
    fmt::print(stderr, "error: unknown argument '{}'\n", arg);
  fmt::print(help ? stdout : stderr, "usage: {}\n", usage);
  std::exit(help ? 0 : 2);
}

} // namespace soap

#endif // SOAP_BENCH_BENCHARGS_H
