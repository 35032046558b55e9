// assemble(): the transfers of every (destination, source) pair that
// intersect, posted as one batch of point-to-point messages, then combined
// in source order.
#include "Assemble.h"

#include <algorithm>
#include <cassert>
#include <limits>

namespace soap {
namespace exec {

void assemble(Comm &comm, const std::vector<Src> &srcs,
              const std::vector<Dst> &dsts, Combine c) {
  int me = comm.rank();
  struct Piece {
    size_t src;
    Box region;
    bool remote;
    FloatVec recv;
  };
  std::vector<std::vector<Piece>> pieces(dsts.size());
  std::vector<FloatVec> sendBufs;
  std::vector<int> sendPeers, sendTags;
  std::vector<std::pair<size_t, size_t>> recvPieces;
  std::vector<int> recvPeers, recvTags;
  int tag = 0;
  for (size_t d = 0; d < dsts.size(); ++d) {
    const Dst &dst = dsts[d];
    for (size_t si = 0; si < srcs.size(); ++si) {
      const Src &src = srcs[si];
      if (src.box.rank() != dst.box.rank())
        continue;
      Box inter = src.box.intersect(dst.box);
      if (inter.empty())
        continue;
      bool near = std::find(src.ranks.begin(), src.ranks.end(), dst.rank) !=
                  src.ranks.end();
      int sender = near ? dst.rank : src.ranks[0];
      if (sender == dst.rank) {
        if (dst.rank == me)
          pieces[d].push_back({si, inter, false, {}});
        continue;
      }
      int t = tag++ % 32000;
      if (sender == me) {
        assert(src.buf && "sender holds no data");
        sendBufs.emplace_back(static_cast<size_t>(inter.volume()));
        packRegion(inter, src.box, src.buf->data.data(),
                   sendBufs.back().data());
        sendPeers.push_back(dst.rank);
        sendTags.push_back(t);
      }
      if (dst.rank == me) {
        pieces[d].push_back(
            {si, inter, true, FloatVec(size_t(inter.volume()))});
        recvPieces.push_back({d, pieces[d].size() - 1});
        recvPeers.push_back(sender);
        recvTags.push_back(t);
      }
    }
  }
  std::vector<Comm::Message> sends, recvs;
  for (size_t k = 0; k < sendBufs.size(); ++k)
    sends.push_back(
        {sendPeers[k], sendTags[k], sendBufs[k].data(), sendBufs[k].size()});
  for (size_t k = 0; k < recvPieces.size(); ++k) {
    Piece &p = pieces[recvPieces[k].first][recvPieces[k].second];
    recvs.push_back({recvPeers[k], recvTags[k], p.recv.data(), p.recv.size()});
  }
  if (!sends.empty() || !recvs.empty())
    comm.exchange(sends, recvs);
  float init = c == Combine::Max ? -std::numeric_limits<float>::infinity() : 0;
  std::vector<Buf> results(dsts.size());
  for (size_t d = 0; d < dsts.size(); ++d) {
    if (dsts[d].rank != me)
      continue;
    Buf &res = results[d];
    res.reset(dsts[d].box, init);
    for (const Piece &p : pieces[d]) {
      if (p.remote)
        combineRegion(p.region, p.region, p.recv.data(), res.box,
                      res.data.data(), c);
      else
        combineRegion(p.region, srcs[p.src].box, srcs[p.src].buf->data.data(),
                      res.box, res.data.data(), c);
    }
  }
  for (size_t d = 0; d < dsts.size(); ++d)
    if (dsts[d].rank == me)
      *dsts[d].out = std::move(results[d]);
}

} // namespace exec
} // namespace soap
