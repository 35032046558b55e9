// Interrupts (Support/Interrupt.h): the first SIGINT or SIGTERM in a scope
// sets the flag and nothing else, the previous handlers come back after it,
// an ignored signal stays ignored, and a second signal exits with 130 and
// removes the file being written (in a child process).
#include "soap/Support/Interrupt.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include <atomic>
#include <catch2/catch.hpp>
#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

using namespace soap;

namespace {

std::atomic<int> seen{0};
void recordSignal(int) { seen.fetch_add(1); }

/// Sets `sig`'s handler for the test's duration, then puts back the one
/// before (Catch2's, or lit's SIG_IGN).
struct HandlerFor {
  int sig;
  struct sigaction before;
  HandlerFor(int s, void (*handler)(int)) : sig(s) {
    struct sigaction sa = {};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, &before);
  }
  ~HandlerFor() { sigaction(sig, &before, nullptr); }
};

void (*currentHandler(int sig))(int) {
  struct sigaction now = {};
  sigaction(sig, nullptr, &now);
  return now.sa_handler;
}

} // namespace

TEST_CASE("the first signal in a scope only sets the flag; the handlers "
          "before come back after it",
          "[Support][Interrupt]") {
  HandlerFor intr(SIGINT, recordSignal), term(SIGTERM, recordSignal);
  seen = 0;
  CHECK_FALSE(interruptRequested());
  for (int sig : {SIGINT, SIGTERM}) {
    {
      InterruptScope scope;
      CHECK_FALSE(interruptRequested());
      {
        InterruptScope nested; // shares the outer scope's handlers
      }
      std::raise(sig);
      CHECK(interruptRequested());
      CHECK(seen == 0);
    }
    CHECK_FALSE(interruptRequested());
    CHECK(currentHandler(SIGINT) == recordSignal);
    CHECK(currentHandler(SIGTERM) == recordSignal);
  }
  std::raise(SIGINT);
  CHECK(seen == 1);
}

TEST_CASE("a signal ignored on entry stays ignored", "[Support][Interrupt]") {
  HandlerFor intr(SIGINT, SIG_IGN);
  {
    InterruptScope scope;
    CHECK(currentHandler(SIGINT) == SIG_IGN);
    std::raise(SIGINT);
    CHECK_FALSE(interruptRequested());
  }
  CHECK(currentHandler(SIGINT) == SIG_IGN);
}

TEST_CASE("a second signal exits with 130 and removes the file being "
          "written",
          "[Support][Interrupt]") {
  llvm::SmallString<128> path;
  REQUIRE_FALSE(llvm::sys::fs::createTemporaryFile("interrupt", "tmp", path));
  std::string file(path);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Only async-signal-safe calls after fork(); _exit, never Catch2's exit.
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    InterruptScope scope;
    RemoveOnAbort remove(file);
    std::raise(SIGINT);
    if (!interruptRequested())
      _exit(1);
    std::raise(SIGTERM); // the second, of either kind
    _exit(2);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK_FALSE(llvm::sys::fs::exists(file));
  llvm::sys::fs::remove(file);
}

TEST_CASE("a file registered once its write ended is not removed",
          "[Support][Interrupt]") {
  llvm::SmallString<128> path;
  REQUIRE_FALSE(llvm::sys::fs::createTemporaryFile("interrupt", "tmp", path));
  std::string file(path);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    signal(SIGINT, SIG_DFL);
    InterruptScope scope;
    { RemoveOnAbort remove(file); }
    std::raise(SIGINT);
    std::raise(SIGINT);
    _exit(2);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(llvm::sys::fs::exists(file));
  llvm::sys::fs::remove(file);
}
