// Communication backends of the reference executor: one rank per device of
// a plan. The executor only ever asks for batches of point-to-point
// messages (every rank enumerates the same global list, so sends and
// receives match by construction) and a barrier; MPI and NCCL implement it.
#ifndef SOAP_EXEC_COMM_H
#define SOAP_EXEC_COMM_H

#include "llvm/Support/Error.h"
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace soap {

class Comm {
public:
  /// One message of a batch: `count` floats to or from rank `peer`.
  struct Message {
    int peer;
    int tag;
    float *data;
    size_t count;
  };

  virtual ~Comm();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Posts every receive and send of a batch and waits for all of them.
  /// Messages between one pair of ranks match in the order they are listed.
  virtual void exchange(const std::vector<Message> &sends,
                        const std::vector<Message> &recvs) = 0;
  virtual void barrier() = 0;

  // Collectives over a group of ranks (ascending, this rank among them),
  // in place on `data`: member i's part is counts[i] floats at the sum of
  // the counts before it (parts may be empty). Every member calls them in
  // the same order. The defaults run rings of exchange() batches; MPI
  // answers with its own collectives.
  /// On return this member's part holds the sum of every member's part.
  virtual void reduceScatter(const std::vector<int> &group, float *data,
                             const std::vector<size_t> &counts);
  /// On return every part holds its owner's part.
  virtual void allGather(const std::vector<int> &group, float *data,
                         const std::vector<size_t> &counts);
  /// On return `count` floats hold the sum over the members.
  virtual void allReduce(const std::vector<int> &group, float *data,
                         size_t count);
  /// "single", "mpi", ...
  virtual std::string name() const = 0;
  /// Ranks of this job on this rank's machine (they share its cores).
  virtual int localSize() const;
  /// Ends every rank at once (MPI_Abort) after an error on this rank alone.
  virtual void abort(int code);
};

/// The communicator of this process: MPI when soap-run was built with it
/// and a launcher started it, else a single rank without MPI (nothing of
/// MPI's run time is needed to run one rank). Initialises MPI.
std::unique_ptr<Comm> createComm(int &argc, char **&argv);
/// An NCCL communicator over the ranks of `mpi` (which bootstraps it), on
/// the GPU numbered rank % device count; errors when NCCL or a GPU is
/// missing. Built with NCCL and MPI only (builtCommBackends lists "nccl").
llvm::Expected<std::unique_ptr<Comm>> createNcclComm(const Comm &mpi);
/// Finalises what createComm initialised (MPI_Finalize).
void finalizeComm(std::unique_ptr<Comm> comm);

/// Names of the communication backends built in ("mpi", "nccl").
std::vector<std::string> builtCommBackends();

} // namespace soap

#endif // SOAP_EXEC_COMM_H
