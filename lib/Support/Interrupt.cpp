// SIGINT and SIGTERM during a search: a flag the searchers poll, and an
// exit at the second signal. The handler only touches lock-free atomics and
// calls write, unlink and _exit (async-signal-safe, POSIX.1 2.4.3).
#include "soap/Support/Interrupt.h"

#include "soap/Support/Error.h"
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <unistd.h>

namespace soap {
namespace {

static_assert(std::atomic<int>::is_always_lock_free &&
                  std::atomic<bool>::is_always_lock_free,
              "a signal handler may only touch lock-free atomics");

/// Signals received since the outermost scope began.
std::atomic<int> received{0};
/// stderr is a terminal: the notice starts on a line of its own, after the
/// terminal's "^C" and any progress line.
std::atomic<bool> onTerminal{false};

/// The file RemoveOnAbort registered; read by the handler while `tempArmed`.
char tempPath[4096];
std::atomic<bool> tempArmed{false};
/// A RemoveOnAbort holds the slot.
std::atomic<bool> tempClaimed{false};

constexpr int kSignals[] = {SIGINT, SIGTERM};
constexpr size_t kNumSignals = sizeof(kSignals) / sizeof(kSignals[0]);
/// Scopes alive; the outermost installs and restores (one thread).
int depth = 0;
struct sigaction previous[kNumSignals];
bool installed[kNumSignals];

void onSignal(int) {
  if (received.fetch_add(1) == 0) {
    int saved = errno;
    static const char notice[] = "\nsoapc: interrupted: stopping the search "
                                 "with what it has so far (interrupt again "
                                 "to abort)\n";
    const char *text = onTerminal.load() ? notice : notice + 1;
    ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
    (void)ignored;
    errno = saved;
    return;
  }
  if (tempArmed.load())
    unlink(tempPath);
  _exit(static_cast<int>(ExitCode::Interrupted));
}

} // namespace

bool interruptRequested() { return received.load() > 0; }

InterruptScope::InterruptScope() {
  if (depth++ > 0)
    return;
  received.store(0);
  onTerminal.store(isatty(STDERR_FILENO) == 1);
  for (size_t i = 0; i < kNumSignals; ++i) {
    installed[i] = false;
    if (sigaction(kSignals[i], nullptr, &previous[i]) != 0)
      continue;
    // Ignored on entry (a background job of a script, nohup): the caller
    // asked not to be stopped by it.
    if (!(previous[i].sa_flags & SA_SIGINFO) &&
        previous[i].sa_handler == SIG_IGN)
      continue;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = onSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; // reads and writes go on, not EINTR
    installed[i] = sigaction(kSignals[i], &sa, nullptr) == 0;
  }
}

InterruptScope::~InterruptScope() {
  if (--depth > 0)
    return;
  for (size_t i = 0; i < kNumSignals; ++i)
    if (installed[i])
      sigaction(kSignals[i], &previous[i], nullptr);
  received.store(0);
}

RemoveOnAbort::RemoveOnAbort(llvm::StringRef path) {
  if (path.size() >= sizeof(tempPath))
    return;
  bool unclaimed = false;
  if (!tempClaimed.compare_exchange_strong(unclaimed, true))
    return;
  std::memcpy(tempPath, path.data(), path.size());
  tempPath[path.size()] = '\0';
  tempArmed.store(true);
  armed_ = true;
}

RemoveOnAbort::~RemoveOnAbort() {
  if (!armed_)
    return;
  tempArmed.store(false);
  tempClaimed.store(false);
}

} // namespace soap
