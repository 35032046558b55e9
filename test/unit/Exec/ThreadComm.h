// An in-process communicator for unit tests: ranks are threads, messages
// go through a shared mailbox (test/unit/Exec).
#ifndef SOAP_TEST_EXEC_THREADCOMM_H
#define SOAP_TEST_EXEC_THREADCOMM_H

#include "soap/Exec/Comm.h"
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace soap::test {

/// Messages between threads: sends are copied into a mailbox per (from,
/// to, tag), receives wait for theirs.
struct Hub {
  std::mutex m;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<float>>> box;
  bool sizeMismatch = false; // Catch2 asserts only on the main thread
};

class ThreadComm : public Comm {
public:
  ThreadComm(Hub &h, int rank, int size) : h_(h), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "threads"; }
  void barrier() override {}
  void exchange(const std::vector<Message> &sends,
                const std::vector<Message> &recvs) override {
    {
      std::lock_guard<std::mutex> l(h_.m);
      for (const Message &s : sends)
        h_.box[{rank_, s.peer, s.tag}].emplace_back(s.data, s.data + s.count);
    }
    h_.cv.notify_all();
    for (const Message &r : recvs) {
      std::unique_lock<std::mutex> l(h_.m);
      auto &q = h_.box[{r.peer, rank_, r.tag}];
      h_.cv.wait(l, [&] { return !q.empty(); });
      if (q.front().size() != r.count)
        h_.sizeMismatch = true;
      else
        std::copy(q.front().begin(), q.front().end(), r.data);
      q.pop_front();
    }
  }

private:
  Hub &h_;
  int rank_, size_;
};

} // namespace soap::test

#endif // SOAP_TEST_EXEC_THREADCOMM_H
