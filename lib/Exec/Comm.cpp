// The single-rank communicator and the MPI one (when built with MPI).
#include "soap/Exec/Comm.h"

#include "soap/Support/Error.h"
#include <cassert>
#include <cstdlib>
#ifdef SOAP_HAVE_MPI
#include <mpi.h>
#endif

namespace soap {

Comm::~Comm() = default;

int Comm::localSize() const { return 1; }

void Comm::abort(int code) {
#ifdef SOAP_HAVE_MPI
  MPI_Abort(MPI_COMM_WORLD, code);
#endif
}

namespace {

/// One process, no messages: the 1-rank reference run.
class SingleComm : public Comm {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void exchange(const std::vector<Message> &sends,
                const std::vector<Message> &recvs) override {
    assert(sends.empty() && recvs.empty() && "one rank sends nothing");
  }
  void barrier() override {}
  std::string name() const override { return "single"; }
};

#ifdef SOAP_HAVE_MPI
/// MPI point-to-point: every receive posted, then every send, then one
/// wait. MPI's non-overtaking rule matches messages of one pair in order.
class MpiComm : public Comm {
public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // A collective: asked here, where every rank is, not on first use.
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_,
                        MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &localSize_);
    MPI_Comm_free(&local);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void exchange(const std::vector<Message> &sends,
                const std::vector<Message> &recvs) override {
    std::vector<MPI_Request> reqs(sends.size() + recvs.size());
    size_t n = 0;
    for (const Message &m : recvs)
      MPI_Irecv(m.data, static_cast<int>(m.count), MPI_FLOAT, m.peer, m.tag,
                MPI_COMM_WORLD, &reqs[n++]);
    for (const Message &m : sends)
      MPI_Isend(m.data, static_cast<int>(m.count), MPI_FLOAT, m.peer, m.tag,
                MPI_COMM_WORLD, &reqs[n++]);
    MPI_Waitall(static_cast<int>(n), reqs.data(), MPI_STATUSES_IGNORE);
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  std::string name() const override { return "mpi"; }
  int localSize() const override { return localSize_; }

private:
  int rank_ = 0, size_ = 1, localSize_ = 1;
};
#endif

} // namespace

std::unique_ptr<Comm> createComm(int &argc, char **&argv) {
#ifdef SOAP_HAVE_MPI
  MPI_Init(&argc, &argv);
  // --help and --version exit from the option parser: finalise there too.
  std::atexit([] {
    int done = 0;
    MPI_Finalized(&done);
    if (!done)
      MPI_Finalize();
  });
  return std::make_unique<MpiComm>();
#else
  return std::make_unique<SingleComm>();
#endif
}

#ifndef SOAP_HAVE_NCCL
llvm::Expected<std::unique_ptr<Comm>> createNcclComm(const Comm &) {
  return inputError("--comm nccl: soap-run was built without NCCL (or MPI)");
}
#endif

void finalizeComm(std::unique_ptr<Comm> comm) {
  comm.reset();
#ifdef SOAP_HAVE_MPI
  MPI_Finalize();
#endif
}

std::vector<std::string> builtCommBackends() {
  std::vector<std::string> b{"single"};
#ifdef SOAP_HAVE_MPI
  b.push_back("mpi");
#endif
#ifdef SOAP_HAVE_NCCL
  b.push_back("nccl");
#endif
  return b;
}

} // namespace soap
