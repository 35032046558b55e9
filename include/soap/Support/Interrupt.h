// Ctrl-C and SIGTERM during a search: the first asks the search to stop as
// at its --timeout (its best plan so far is verified and written); a second
// exits at once with 130, removing the file being written.
#ifndef SOAP_SUPPORT_INTERRUPT_H
#define SOAP_SUPPORT_INTERRUPT_H

#include "llvm/ADT/StringRef.h"

namespace soap {

/// True once SIGINT or SIGTERM arrived while an InterruptScope is alive
/// (false outside one). Searchers read it through
/// SearchOptions::pastDeadline.
bool interruptRequested();

/// Handles SIGINT and SIGTERM for its lifetime, then restores the previous
/// handlers: the first signal sets interruptRequested() and says so on
/// stderr, a second one _exit()s with ExitCode::Interrupted (130). A signal
/// ignored when the scope begins (SIGINT of a `cmd &` in a script, nohup) stays
/// ignored. Created on one thread (the tool's); nested scopes share the
/// outermost one's.
class InterruptScope {
public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope &) = delete;
  InterruptScope &operator=(const InterruptScope &) = delete;
};

/// While alive, the second signal of an InterruptScope removes `path` (a
/// temporary file being written) before it exits, so that nothing half
/// written is left. One file at a time; a second one at once is not
/// registered (it is still written atomically, and only a `.tmp` could be
/// left behind).
class RemoveOnAbort {
public:
  explicit RemoveOnAbort(llvm::StringRef path);
  ~RemoveOnAbort();
  RemoveOnAbort(const RemoveOnAbort &) = delete;
  RemoveOnAbort &operator=(const RemoveOnAbort &) = delete;

private:
  bool armed_ = false;
};

} // namespace soap

#endif // SOAP_SUPPORT_INTERRUPT_H
