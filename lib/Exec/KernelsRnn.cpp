// The ONNX LSTM layer (forward and backpropagation through time), gates in
// ONNX's order i, o, f, c with sigmoid / tanh / tanh: per direction one GEMM
// of the whole input sequence by W, then per step one GEMM of h_{t-1} by R;
// backward runs the steps in reverse and ends with one GEMM each for dX and
// dW. A tile holds whole sequences, gates and inputs, and any range of
// samples, directions and hidden units: tiles of the hidden units exchange
// their slices of h after every step (and sum their partial dh_{t-1} in
// backward) through the statistics exchange.
#include "Kernels.h"

#include "Gemm.h"
#include "soap/Support/Error.h"
#include <cmath>

namespace soap {
namespace exec {

namespace {

// Loops of the LSTM semantics (lib/IR/OpsLinear.cpp): t, dir, n, gate, h,
// i, j.
enum : int { kT, kDir, kN, kGate, kH, kI, kJ };

llvm::Error checkLstm(const Graph &g, const Op &op) {
  if (op.input(4) != kNoValue)
    return inputError("LSTM sequence_lens is not supported (every sequence "
                      "runs its full length)");
  if (op.input(7) != kNoValue)
    return inputError("LSTM peepholes (input P) are not supported");
  if (op.hasAttr("clip"))
    return inputError("LSTM clip is not supported");
  if (op.getInt("input_forget", 0) != 0)
    return inputError("LSTM input_forget=1 is not supported");
  return llvm::Error::success();
}

float sigmoid(float x) { return 1 / (1 + std::exp(-x)); }

/// One task of the layer: its ranges and offsets into its buffers. Every
/// map of the layer is one loop per dim, so a buffer's offset is
/// sum (index - lo) * stride over its dims.
struct Lstm {
  Task &t;
  bool batchFirst, reverse;
  int64_t T, H, Hs, hLo, I, nLo, N, dLo, D;

  Lstm(const Op &op, Task &task) : t(task) {
    batchFirst = op.getInt("layout", 0) == 1;
    reverse = op.getString("direction", "forward") == "reverse";
    const Box &l = t.loops;
    T = l.hi[kT] - l.lo[kT];
    H = op.sem.loops[kH].size;
    hLo = l.lo[kH];
    Hs = l.hi[kH] - hLo;
    I = l.hi[kI] - l.lo[kI];
    nLo = l.lo[kN];
    N = l.hi[kN] - nLo;
    dLo = l.lo[kDir];
    D = l.hi[kDir] - dLo;
  }

  /// Does direction d run backwards in time (ONNX: the second of a
  /// bidirectional layer, or the one of a reverse layer)?
  bool backwards(int64_t d) const { return reverse || d == 1; }
  /// The time of the k-th step of direction d.
  int64_t timeAt(int64_t d, int64_t k) const {
    return backwards(d) ? T - 1 - k : k;
  }
  /// The row of X (and of the gate buffers) at time s, sample n (relative).
  int64_t xRow(int64_t s, int64_t n) const {
    return batchFirst ? n * T + s : s * N + n;
  }
  /// Offset of Y[t, d, n, h0] (layout 0) or Y[n, t, d, h0] (layout 1).
  int64_t yOff(const Buf &y, int64_t s, int64_t dk, int64_t n) const {
    std::vector<int64_t> st = boxStrides(y.box);
    return batchFirst ? n * st[0] + s * st[1] + dk * st[2]
                      : s * st[0] + dk * st[1] + n * st[2];
  }
  /// Offset of a state [d, n, x0] (layout 0) or [n, d, x0] (layout 1).
  int64_t stateOff(const Buf &b, int64_t dk, int64_t n) const {
    std::vector<int64_t> st = boxStrides(b.box);
    return batchFirst ? n * st[0] + dk * st[1] : dk * st[0] + n * st[1];
  }
  static bool has(const std::vector<Buf> &v, size_t k) {
    return k < v.size() && v[k].size() > 0;
  }
  // Per direction (relative dk): the tile's rows of W [4 Hs, I], R
  // [4 Hs, H] and the biases [2][4 Hs].
  const float *w(int64_t dk) const {
    return t.in[1].data.data() + dk * 4 * Hs * I;
  }
  const float *r(int64_t dk) const {
    return t.in[2].data.data() + dk * 4 * Hs * H;
  }
};

/// The rows a step exchanges, per task: [D][N][H] over the loops dir, n
/// and h (h whole).
std::vector<bool> exchangeKeep(const OpSemantics &sem) {
  std::vector<bool> keep(sem.loops.size(), false);
  keep[kDir] = keep[kN] = keep[kH] = true;
  return keep;
}

Buf exchangeBuf(const OpSemantics &sem, const Task &t) {
  Box b = loopSubsetBox(t.loops, exchangeKeep(sem));
  b.lo[kH] = 0;
  b.hi[kH] = sem.loops[kH].size;
  Buf out;
  out.reset(b);
  return out;
}

// Saved per task: 0 the activated gates [D][T x N rows][4 Hs] (rows in X's
// order), 1 the cell states [D][T][N][Hs] by step, 2 the whole hidden
// state before each step [D][T][N][H].

void lstmForward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  std::vector<bool> keep = exchangeKeep(sem);
  std::vector<Lstm> ls;
  std::vector<Buf> hx(ctx.tasks.size()); // h_{t-1} whole, exchanged
  std::vector<std::vector<float>> cPrev(ctx.tasks.size());
  int64_t steps = 0;
  for (size_t q = 0; q < ctx.tasks.size(); ++q) {
    Task &t = ctx.tasks[q];
    ls.emplace_back(ctx.op, t);
    const Lstm &L = ls.back();
    int64_t G = 4 * L.Hs, rows = L.T * L.N;
    steps = L.T;
    t.saved.assign(3, Buf());
    t.saved[0].data.assign(size_t(L.D * rows * G), 0.0f);
    t.saved[1].data.assign(size_t(L.D * L.T * L.N * L.Hs), 0.0f);
    t.saved[2].data.assign(size_t(L.D * L.T * L.N * L.H), 0.0f);
    hx[q] = exchangeBuf(sem, t);
    cPrev[q].assign(size_t(L.D * L.N * L.Hs), 0.0f);
    for (int64_t dk = 0; dk < L.D; ++dk) {
      // gates = X W' + Wb + Rb, every step at once.
      float *gates = t.saved[0].data.data() + dk * rows * G;
      matmulAcc({gates, rows, G, G, 1},
                {t.in[0].data.data(), rows, L.I, L.I, 1},
                MatView{L.w(dk), G, L.I, L.I, 1}.t(), 1.0f);
      if (Lstm::has(t.in, 3)) {
        const float *b = t.in[3].data.data() + dk * 2 * G;
        for (int64_t q2 = 0; q2 < rows; ++q2)
          for (int64_t k = 0; k < G; ++k)
            gates[q2 * G + k] += b[k] + b[G + k];
      }
      for (int64_t n = 0; n < L.N; ++n) {
        if (Lstm::has(t.in, 5)) {
          const float *h0 = t.in[5].data.data() + L.stateOff(t.in[5], dk, n);
          std::copy(h0, h0 + L.H, hx[q].data.begin() + (dk * L.N + n) * L.H);
        }
        if (Lstm::has(t.in, 6)) {
          const float *c0 = t.in[6].data.data() + L.stateOff(t.in[6], dk, n);
          std::copy(c0, c0 + L.Hs, cPrev[q].begin() + (dk * L.N + n) * L.Hs);
        }
      }
    }
  }
  // The steps in lockstep over the tasks: after each, the tiles of the
  // hidden units exchange their slices of h.
  std::vector<Buf *> rowsOf;
  for (Buf &b : hx)
    rowsOf.push_back(&b);
  for (int64_t k = 0; k < steps; ++k) {
    for (size_t q = 0; q < ctx.tasks.size(); ++q) {
      Task &t = ctx.tasks[q];
      const Lstm &L = ls[q];
      int64_t G = 4 * L.Hs, rows = L.T * L.N, Hs = L.Hs;
      std::vector<float> g(size_t(L.N * G));
      for (int64_t dk = 0; dk < L.D; ++dk) {
        int64_t s = L.timeAt(dk + L.dLo, k);
        float *gates = t.saved[0].data.data() + dk * rows * G;
        float *cs = t.saved[1].data.data() + (dk * L.T + k) * L.N * Hs;
        float *hprev = hx[q].data.data() + dk * L.N * L.H;
        std::copy(hprev, hprev + L.N * L.H,
                  t.saved[2].data.begin() + (dk * L.T + k) * L.N * L.H);
        // g = h_{t-1} R' (this tile's gate rows).
        std::fill(g.begin(), g.end(), 0.0f);
        matmulAcc({g.data(), L.N, G, G, 1}, {hprev, L.N, L.H, L.H, 1},
                  MatView{L.r(dk), G, L.H, L.H, 1}.t(), 1.0f);
        for (int64_t n = 0; n < L.N; ++n) {
          float *gr = gates + L.xRow(s, n) * G;
          const float *hr = g.data() + n * G;
          float *cp = cPrev[q].data() + (dk * L.N + n) * Hs;
          float *c = cs + n * Hs;
          float *h = hprev + n * L.H + L.hLo; // this tile's slice
          for (int64_t u = 0; u < Hs; ++u) {
            float gi = sigmoid(gr[u] + hr[u]);
            float go = sigmoid(gr[Hs + u] + hr[Hs + u]);
            float gf = sigmoid(gr[2 * Hs + u] + hr[2 * Hs + u]);
            float gc = std::tanh(gr[3 * Hs + u] + hr[3 * Hs + u]);
            gr[u] = gi;
            gr[Hs + u] = go;
            gr[2 * Hs + u] = gf;
            gr[3 * Hs + u] = gc;
            c[u] = gf * cp[u] + gi * gc;
            cp[u] = c[u];
            h[u] = go * std::tanh(c[u]);
          }
          if (Lstm::has(t.out, 0))
            std::copy(h, h + Hs,
                      t.out[0].data.begin() + L.yOff(t.out[0], s, dk, n));
          if (k + 1 == steps)
            for (size_t o : {size_t(1), size_t(2)})
              if (Lstm::has(t.out, o)) {
                const float *src = o == 1 ? h : c;
                std::copy(src, src + Hs,
                          t.out[o].data.begin() + L.stateOff(t.out[o], dk, n));
              }
        }
      }
    }
    if (k + 1 < steps)
      ctx.stats.allGather(keep, kH, rowsOf, false);
  }
}

void lstmBackward(KernelCtx &ctx) {
  const OpSemantics &sem = ctx.op.sem;
  std::vector<bool> keep = exchangeKeep(sem);
  std::vector<Lstm> ls;
  std::vector<Buf> dhx(ctx.tasks.size()); // partial dh_{t-1}, summed
  std::vector<std::vector<float>> dh(ctx.tasks.size()), dc(ctx.tasks.size()),
      dG(ctx.tasks.size());
  int64_t steps = 0;
  for (size_t q = 0; q < ctx.tasks.size(); ++q) {
    Task &t = ctx.tasks[q];
    ls.emplace_back(ctx.op, t);
    const Lstm &L = ls.back();
    steps = L.T;
    dhx[q] = exchangeBuf(sem, t);
    dh[q].assign(size_t(L.D * L.N * L.Hs), 0.0f);
    dc[q].assign(size_t(L.D * L.N * L.Hs), 0.0f);
    dG[q].assign(size_t(L.D * L.T * L.N * 4 * L.Hs), 0.0f);
    for (int64_t dk = 0; dk < L.D; ++dk)
      for (int64_t n = 0; n < L.N; ++n)
        for (auto [o, v] :
             {std::pair<size_t, std::vector<float> *>{1, &dh[q]}, {2, &dc[q]}})
          if (Lstm::has(t.gout, o)) {
            const float *src =
                t.gout[o].data.data() + L.stateOff(t.gout[o], dk, n);
            std::copy(src, src + L.Hs, v->begin() + (dk * L.N + n) * L.Hs);
          }
  }
  std::vector<Buf *> rowsOf;
  for (Buf &b : dhx)
    rowsOf.push_back(&b);
  for (int64_t k = steps - 1; k >= 0; --k) {
    for (size_t q = 0; q < ctx.tasks.size(); ++q) {
      Task &t = ctx.tasks[q];
      const Lstm &L = ls[q];
      int64_t G = 4 * L.Hs, rows = L.T * L.N, Hs = L.Hs;
      std::fill(dhx[q].data.begin(), dhx[q].data.end(), 0.0f);
      std::vector<float> step(size_t(L.N * G));
      for (int64_t dk = 0; dk < L.D; ++dk) {
        int64_t s = L.timeAt(dk + L.dLo, k);
        const float *gates = t.saved[0].data.data() + dk * rows * G;
        const float *cs = t.saved[1].data.data() + dk * L.T * L.N * Hs;
        const float *hprev =
            t.saved[2].data.data() + (dk * L.T + k) * L.N * L.H;
        float *dgAll = dG[q].data() + dk * rows * G;
        for (int64_t n = 0; n < L.N; ++n) {
          const float *gr = gates + L.xRow(s, n) * G;
          float *dg = dgAll + L.xRow(s, n) * G;
          const float *c = cs + (k * L.N + n) * Hs;
          const float *cp = nullptr;
          if (k > 0)
            cp = cs + ((k - 1) * L.N + n) * Hs;
          else if (Lstm::has(t.in, 6))
            cp = t.in[6].data.data() + L.stateOff(t.in[6], dk, n);
          float *dhn = dh[q].data() + (dk * L.N + n) * Hs;
          float *dcn = dc[q].data() + (dk * L.N + n) * Hs;
          if (Lstm::has(t.gout, 0)) {
            const float *dy =
                t.gout[0].data.data() + L.yOff(t.gout[0], s, dk, n);
            for (int64_t u = 0; u < Hs; ++u)
              dhn[u] += dy[u];
          }
          for (int64_t u = 0; u < Hs; ++u) {
            float gi = gr[u], go = gr[Hs + u], gf = gr[2 * Hs + u],
                  gc = gr[3 * Hs + u];
            float tc = std::tanh(c[u]);
            float dC = dcn[u] + dhn[u] * go * (1 - tc * tc);
            float cpu = cp ? cp[u] : 0.0f;
            dg[u] = dC * gc * gi * (1 - gi);
            dg[Hs + u] = dhn[u] * tc * go * (1 - go);
            dg[2 * Hs + u] = dC * cpu * gf * (1 - gf);
            dg[3 * Hs + u] = dC * gi * (1 - gc * gc);
            dcn[u] = dC * gf;
          }
          std::copy(dg, dg + G, step.begin() + n * G);
        }
        // dR += dG_t' h_{t-1}; dh_{t-1} (partial over this tile's gate
        // rows) = dG_t R, summed over the hidden units' tiles below.
        if (Lstm::has(t.gin, 2))
          matmulAcc({t.gin[2].data.data() + dk * G * L.H, G, L.H, L.H, 1},
                    MatView{step.data(), L.N, G, G, 1}.t(),
                    {hprev, L.N, L.H, L.H, 1}, 1.0f);
        float *part = dhx[q].data.data() + dk * L.N * L.H;
        matmulAcc({part, L.N, L.H, L.H, 1}, {step.data(), L.N, G, G, 1},
                  {L.r(dk), G, L.H, L.H, 1}, 1.0f);
        // Before the first step: the initial state's gradient (each tile
        // adds its partial sum; the executor sums the tiles').
        if (k == 0)
          for (int64_t n = 0; n < L.N; ++n) {
            if (Lstm::has(t.gin, 5)) {
              float *p = t.gin[5].data.data() + L.stateOff(t.gin[5], dk, n);
              for (int64_t u = 0; u < L.H; ++u)
                p[u] += part[n * L.H + u];
            }
            if (Lstm::has(t.gin, 6)) {
              float *p = t.gin[6].data.data() + L.stateOff(t.gin[6], dk, n);
              for (int64_t u = 0; u < Hs; ++u)
                p[u] += dc[q][size_t((dk * L.N + n) * Hs + u)];
            }
          }
      }
    }
    if (k == 0)
      break;
    ctx.stats.allGather(keep, kH, rowsOf, true);
    for (size_t q = 0; q < ctx.tasks.size(); ++q) {
      const Lstm &L = ls[q];
      for (int64_t dk = 0; dk < L.D; ++dk)
        for (int64_t n = 0; n < L.N; ++n) {
          const float *src = dhx[q].data.data() + (dk * L.N + n) * L.H + L.hLo;
          std::copy(src, src + L.Hs, dh[q].begin() + (dk * L.N + n) * L.Hs);
        }
    }
  }
  // dX += dG W; dW += dG' X; both biases get the sum of dG.
  for (size_t q = 0; q < ctx.tasks.size(); ++q) {
    Task &t = ctx.tasks[q];
    const Lstm &L = ls[q];
    int64_t G = 4 * L.Hs, rows = L.T * L.N;
    for (int64_t dk = 0; dk < L.D; ++dk) {
      const float *dg = dG[q].data() + dk * rows * G;
      if (Lstm::has(t.gin, 0))
        matmulAcc({t.gin[0].data.data(), rows, L.I, L.I, 1},
                  {dg, rows, G, G, 1}, {L.w(dk), G, L.I, L.I, 1}, 1.0f);
      if (Lstm::has(t.gin, 1))
        matmulAcc({t.gin[1].data.data() + dk * G * L.I, G, L.I, L.I, 1},
                  MatView{dg, rows, G, G, 1}.t(),
                  {t.in[0].data.data(), rows, L.I, L.I, 1}, 1.0f);
      if (Lstm::has(t.gin, 3)) {
        float *db = t.gin[3].data.data() + dk * 2 * G;
        for (int64_t q2 = 0; q2 < rows; ++q2)
          for (int64_t k = 0; k < G; ++k) {
            db[k] += dg[q2 * G + k];
            db[G + k] += dg[q2 * G + k];
          }
      }
    }
  }
}

const Kernel kLstm = {checkLstm, lstmForward, lstmBackward};

} // namespace

const Kernel *findRnnKernel(llvm::StringRef kind) {
  return kind == "LSTM" ? &kLstm : nullptr;
}

} // namespace exec
} // namespace soap
