// The NCCL communicator: the same batches of point-to-point messages as the
// MPI one, as grouped ncclSend/ncclRecv on the rank's GPU (NCCL matches the
// messages of one pair of ranks in the order they are posted), bootstrapped
// through MPI (rank 0's ncclUniqueId broadcast). Buffers are staged through
// one device buffer per direction.
#include "soap/Exec/Comm.h"

#include "soap/Support/Error.h"
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

namespace soap {

namespace {

class NcclComm : public Comm {
public:
  NcclComm(ncclComm_t c, cudaStream_t s, int rank, int size, int localSize)
      : comm_(c), stream_(s), rank_(rank), size_(size), localSize_(localSize) {}
  ~NcclComm() override {
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
    cudaFree(send_);
    cudaFree(recv_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int localSize() const override { return localSize_; }
  std::string name() const override { return "nccl"; }
  void barrier() override {
    if (size_ > 1)
      MPI_Barrier(MPI_COMM_WORLD);
  }

  void exchange(const std::vector<Message> &sends,
                const std::vector<Message> &recvs) override {
    size_t ns = 0, nr = 0;
    for (const Message &m : sends)
      ns += m.count;
    for (const Message &m : recvs)
      nr += m.count;
    reserve(send_, sendCap_, ns);
    reserve(recv_, recvCap_, nr);
    size_t off = 0;
    for (const Message &m : sends) {
      cudaMemcpyAsync(send_ + off, m.data, m.count * sizeof(float),
                      cudaMemcpyHostToDevice, stream_);
      off += m.count;
    }
    ncclGroupStart();
    off = 0;
    for (const Message &m : recvs) {
      ncclRecv(recv_ + off, m.count, ncclFloat, m.peer, comm_, stream_);
      off += m.count;
    }
    off = 0;
    for (const Message &m : sends) {
      ncclSend(send_ + off, m.count, ncclFloat, m.peer, comm_, stream_);
      off += m.count;
    }
    ncclGroupEnd();
    off = 0;
    for (const Message &m : recvs) {
      cudaMemcpyAsync(m.data, recv_ + off, m.count * sizeof(float),
                      cudaMemcpyDeviceToHost, stream_);
      off += m.count;
    }
    cudaStreamSynchronize(stream_);
  }

private:
  static void reserve(float *&p, size_t &cap, size_t n) {
    if (n <= cap)
      return;
    cudaFree(p);
    p = nullptr;
    cudaMalloc(&p, n * sizeof(float));
    cap = n;
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_, size_, localSize_;
  float *send_ = nullptr, *recv_ = nullptr;
  size_t sendCap_ = 0, recvCap_ = 0;
};

} // namespace

llvm::Expected<std::unique_ptr<Comm>> createNcclComm(const Comm &mpi) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return inputError("--comm nccl: no CUDA device");
  cudaSetDevice(mpi.rank() % devices);
  ncclUniqueId id;
  if (mpi.rank() == 0)
    ncclGetUniqueId(&id);
  if (mpi.size() > 1)
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t c;
  ncclResult_t r = ncclCommInitRank(&c, mpi.size(), id, mpi.rank());
  if (r != ncclSuccess)
    return internalError("ncclCommInitRank: {}", ncclGetErrorString(r));
  cudaStream_t s;
  cudaStreamCreate(&s);
  return std::unique_ptr<Comm>(
      new NcclComm(c, s, mpi.rank(), mpi.size(), mpi.localSize()));
}

} // namespace soap
