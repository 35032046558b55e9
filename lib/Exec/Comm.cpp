// The single-rank communicator and the MPI one (when built with MPI).
#include "soap/Exec/Comm.h"

#include "Memory.h"
#include "soap/Support/Error.h"
#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <map>
#ifdef SOAP_HAVE_MPI
#include <mpi.h>
#endif

namespace soap {

Comm::~Comm() = default;

int Comm::localSize() const { return 1; }

void Comm::abort(int code) {
#ifdef SOAP_HAVE_MPI
  int started = 0;
  MPI_Initialized(&started);
  if (started)
    MPI_Abort(MPI_COMM_WORLD, code);
#endif
}

#ifdef SOAP_HAVE_MPI
/// Whether a launcher started this process as an MPI rank: Open MPI's
/// mpirun, PMIx launchers (Open MPI 5, Slurm) and Hydra/PMI-1 (MPICH, Intel
/// MPI) each set one of these in every rank.
static bool launchedByMpi() {
  for (const char *v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                        "PMI_SIZE"})
    if (std::getenv(v))
      return true;
  return false;
}
#endif

namespace {

/// The tag of the default collectives' messages (assemble's stay below).
constexpr int kCollectiveTag = 32001;

/// This rank's position in `group`.
size_t memberIndex(const std::vector<int> &group, int rank) {
  auto it = std::find(group.begin(), group.end(), rank);
  assert(it != group.end() && "a collective on a group without this rank");
  return size_t(it - group.begin());
}

std::vector<size_t> offsetsOf(const std::vector<size_t> &counts) {
  std::vector<size_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i)
    off[i + 1] = off[i] + counts[i];
  return off;
}

} // namespace

// Rings: at step s member i passes part (i - s - 1) (reduce-scatter: its
// running sum) or (i - s) (all-gather) to member i + 1.
void Comm::reduceScatter(const std::vector<int> &group, float *data,
                         const std::vector<size_t> &counts) {
  size_t n = group.size(), i = memberIndex(group, rank());
  if (n < 2)
    return;
  std::vector<size_t> off = offsetsOf(counts);
  int next = group[(i + 1) % n], prev = group[(i + n - 1) % n];
  exec::FloatVec recv;
  for (size_t s = 0; s + 1 < n; ++s) {
    size_t sp = (i + 2 * n - s - 1) % n, rp = (i + 2 * n - s - 2) % n;
    recv.assign(counts[rp], 0.0f);
    std::vector<Message> sends, recvs;
    if (counts[sp])
      sends.push_back({next, kCollectiveTag, data + off[sp], counts[sp]});
    if (counts[rp])
      recvs.push_back({prev, kCollectiveTag, recv.data(), counts[rp]});
    exchange(sends, recvs);
    for (size_t k = 0; k < counts[rp]; ++k)
      data[off[rp] + k] += recv[k];
  }
}

void Comm::allGather(const std::vector<int> &group, float *data,
                     const std::vector<size_t> &counts) {
  size_t n = group.size(), i = memberIndex(group, rank());
  if (n < 2)
    return;
  std::vector<size_t> off = offsetsOf(counts);
  int next = group[(i + 1) % n], prev = group[(i + n - 1) % n];
  for (size_t s = 0; s + 1 < n; ++s) {
    size_t sp = (i + n - s) % n, rp = (i + 2 * n - s - 1) % n;
    std::vector<Message> sends, recvs;
    if (counts[sp])
      sends.push_back({next, kCollectiveTag, data + off[sp], counts[sp]});
    if (counts[rp])
      recvs.push_back({prev, kCollectiveTag, data + off[rp], counts[rp]});
    exchange(sends, recvs);
  }
}

void Comm::allReduce(const std::vector<int> &group, float *data, size_t count) {
  size_t n = group.size();
  if (n < 2)
    return;
  std::vector<size_t> counts(n);
  size_t chunk = (count + n - 1) / n;
  for (size_t k = 0; k < n; ++k)
    counts[k] = std::min(chunk, count - std::min(count, k * chunk));
  reduceScatter(group, data, counts);
  allGather(group, data, counts);
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
  ~MpiComm() override {
    for (auto &[g, c] : groups_)
      MPI_Comm_free(&c);
  }

  void reduceScatter(const std::vector<int> &group, float *data,
                     const std::vector<size_t> &counts) override {
    if (group.size() < 2)
      return;
    size_t i = memberIndex(group, rank_);
    std::vector<int> rc(counts.begin(), counts.end());
    // In place: the input is the whole buffer, the result lands at its
    // start; it moves to this member's part.
    MPI_Reduce_scatter(MPI_IN_PLACE, data, rc.data(), MPI_FLOAT, MPI_SUM,
                       groupComm(group));
    size_t off = 0;
    for (size_t k = 0; k < i; ++k)
      off += counts[k];
    if (off)
      std::memmove(data + off, data, counts[i] * sizeof(float));
  }
  void allGather(const std::vector<int> &group, float *data,
                 const std::vector<size_t> &counts) override {
    if (group.size() < 2)
      return;
    std::vector<int> rc(counts.begin(), counts.end()), displs(counts.size());
    for (size_t k = 1; k < counts.size(); ++k)
      displs[k] = displs[k - 1] + rc[k - 1];
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, rc.data(),
                   displs.data(), MPI_FLOAT, groupComm(group));
  }
  void allReduce(const std::vector<int> &group, float *data,
                 size_t count) override {
    if (group.size() < 2)
      return;
    MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT,
                  MPI_SUM, groupComm(group));
  }

private:
  /// The communicator of `group`, made on first use by its members alone
  /// (MPI_Comm_create_group), which all reach it in the same order.
  MPI_Comm groupComm(const std::vector<int> &group) {
    auto it = groups_.find(group);
    if (it != groups_.end())
      return it->second;
    MPI_Group world, sub;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, static_cast<int>(group.size()), group.data(), &sub);
    MPI_Comm c;
    MPI_Comm_create_group(MPI_COMM_WORLD, sub, 0, &c);
    MPI_Group_free(&sub);
    MPI_Group_free(&world);
    return groups_.emplace(group, c).first->second;
  }

  int rank_ = 0, size_ = 1, localSize_ = 1;
  std::map<std::vector<int>, MPI_Comm> groups_;
};
#endif

} // namespace

std::unique_ptr<Comm> createComm(int &argc, char **&argv) {
#ifdef SOAP_HAVE_MPI
  if (!launchedByMpi())
    return std::make_unique<SingleComm>();
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
  int started = 0, done = 0;
  MPI_Initialized(&started);
  MPI_Finalized(&done);
  if (started && !done)
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
