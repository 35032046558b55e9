// assemble(): the transfers of every (destination, source) pair that
// intersect, posted as one batch of point-to-point messages, then combined
// in source order.
#include "Assemble.h"

#include <algorithm>
#include <cassert>
#include <limits>

namespace soap {
namespace exec {

namespace {

bool sameBox(const Box &a, const Box &b) { return a.lo == b.lo && a.hi == b.hi; }

} // namespace

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
  std::vector<FloatVec> packed;
  std::vector<Comm::Message> sends, recvs;
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
        if (sameBox(inter, src.box)) {
          // The whole source: sent from where it is, not copied first.
          sends.push_back({dst.rank, t, const_cast<float *>(src.buf->data.data()),
                           src.buf->data.size()});
        } else {
          packed.emplace_back(static_cast<size_t>(inter.volume()));
          packRegion(inter, src.box, src.buf->data.data(),
                     packed.back().data());
          sends.push_back(
              {dst.rank, t, packed.back().data(), packed.back().size()});
        }
      }
      if (dst.rank == me) {
        pieces[d].push_back({si, inter, true, {}});
        recvPieces.push_back({d, pieces[d].size() - 1});
        recvPeers.push_back(sender);
        recvTags.push_back(t);
      }
    }
  }
  // A destination that is one received piece whole receives it in place;
  // every other piece into a buffer of its own, combined below.
  float init = c == Combine::Max ? -std::numeric_limits<float>::infinity() : 0;
  std::vector<Buf> results(dsts.size());
  std::vector<uint8_t> direct(dsts.size(), 0);
  for (size_t d = 0; d < dsts.size(); ++d)
    if (dsts[d].rank == me && pieces[d].size() == 1 && pieces[d][0].remote &&
        sameBox(pieces[d][0].region, dsts[d].box)) {
      direct[d] = 1;
      results[d].reset(dsts[d].box, init);
    }
  for (size_t k = 0; k < recvPieces.size(); ++k) {
    auto [d, i] = recvPieces[k];
    Piece &p = pieces[d][i];
    float *at;
    size_t n = static_cast<size_t>(p.region.volume());
    if (direct[d]) {
      at = results[d].data.data();
    } else {
      p.recv.resize(n);
      at = p.recv.data();
    }
    recvs.push_back({recvPeers[k], recvTags[k], at, n});
  }
  if (!sends.empty() || !recvs.empty())
    comm.exchange(sends, recvs);
  packed.clear();
  for (size_t d = 0; d < dsts.size(); ++d) {
    if (dsts[d].rank != me || direct[d])
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
