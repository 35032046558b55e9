// The ONNX LSTM layer (forward and backpropagation through time), gates in
// ONNX's order i, o, f, c with sigmoid / tanh / tanh: per direction one GEMM
// of the whole input sequence by W, then per step one GEMM of h_{t-1} by R;
// backward runs the steps in reverse and ends with one GEMM each for dX and
// dW. A tile holds whole sequences, gates, hidden units and inputs; it may
// cover a range of samples and directions (the executor refuses plans that
// split the hidden units: the recurrence would exchange h at every step).
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

/// Offsets into one task's buffers. Every map of the layer is one loop per
/// dim, so a buffer's offset is sum (index - lo) * stride over its dims.
struct Lstm {
  const Op &op;
  Task &t;
  bool batchFirst, reverse;
  int64_t T, H, I, nLo, nCount, dLo, dCount;

  Lstm(const Op &o, Task &task) : op(o), t(task) {
    batchFirst = op.getInt("layout", 0) == 1;
    reverse = op.getString("direction", "forward") == "reverse";
    const Box &l = t.loops;
    T = l.hi[kT] - l.lo[kT];
    H = l.hi[kH] - l.lo[kH];
    I = l.hi[kI] - l.lo[kI];
    nLo = l.lo[kN];
    nCount = l.hi[kN] - nLo;
    dLo = l.lo[kDir];
    dCount = l.hi[kDir] - dLo;
  }

  /// Does direction d run backwards in time (ONNX: the second of a
  /// bidirectional layer, or the one of a reverse layer)?
  bool backwards(int64_t d) const { return reverse || d == 1; }
  /// The time of the k-th step of direction d.
  int64_t timeAt(int64_t d, int64_t k) const {
    return backwards(d) ? T - 1 - k : k;
  }

  /// The row of X (and of the per-row gate buffers) at time s, sample n.
  int64_t xRow(int64_t s, int64_t n) const {
    return batchFirst ? (n - nLo) * T + s : s * nCount + (n - nLo);
  }
  /// Offset of Y[t, d, n, 0] (layout 0) or Y[n, t, d, 0] (layout 1).
  int64_t yOff(const Buf &y, int64_t s, int64_t d, int64_t n) const {
    std::vector<int64_t> st = boxStrides(y.box);
    return batchFirst ? (n - nLo) * st[0] + s * st[1] + (d - dLo) * st[2]
                      : s * st[0] + (d - dLo) * st[1] + (n - nLo) * st[2];
  }
  /// Offset of a state [d, n, 0] (layout 0) or [n, d, 0] (layout 1).
  int64_t stateOff(const Buf &b, int64_t d, int64_t n) const {
    std::vector<int64_t> st = boxStrides(b.box);
    return batchFirst ? (n - nLo) * st[0] + (d - dLo) * st[1]
                      : (d - dLo) * st[0] + (n - nLo) * st[1];
  }
  bool has(const std::vector<Buf> &v, size_t k) const {
    return k < v.size() && v[k].size() > 0;
  }
};

// Saved per task: 0 the activated gates [D][T x N rows][4H] (rows in X's
// order), 1 the cell states and 2 the hidden states [D][T][N][H] by step.

void lstmForward(KernelCtx &ctx) {
  for (Task &t : ctx.tasks) {
    Lstm L(ctx.op, t);
    int64_t T = L.T, H = L.H, I = L.I, N = L.nCount, G = 4 * H;
    int64_t rows = T * N;
    t.saved.assign(3, Buf());
    t.saved[0].data.assign(size_t(L.dCount * rows * G), 0.0f);
    t.saved[1].data.assign(size_t(L.dCount * T * N * H), 0.0f);
    t.saved[2].data.assign(size_t(L.dCount * T * N * H), 0.0f);
    const float *x = t.in[0].data.data();
    std::vector<float> hPrev(size_t(N * H)), cPrev(size_t(N * H));
    for (int64_t d = L.dLo; d < L.dLo + L.dCount; ++d) {
      int64_t dk = d - L.dLo;
      const float *w = t.in[1].data.data() + dk * G * I;
      const float *r = t.in[2].data.data() + dk * G * H;
      float *gates = t.saved[0].data.data() + dk * rows * G;
      float *cs = t.saved[1].data.data() + dk * T * N * H;
      float *hs = t.saved[2].data.data() + dk * T * N * H;
      // gates = X W' + Wb + Rb, every step at once.
      matmulAcc({gates, rows, G, G, 1}, {x, rows, I, I, 1},
                MatView{w, G, I, I, 1}.t(), 1.0f);
      if (L.has(t.in, 3)) {
        const float *b = t.in[3].data.data() + dk * 2 * G;
        for (int64_t q = 0; q < rows; ++q)
          for (int64_t k = 0; k < G; ++k)
            gates[q * G + k] += b[k] + b[G + k];
      }
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < H; ++k) {
          hPrev[size_t(n * H + k)] =
              L.has(t.in, 5)
                  ? t.in[5].data[size_t(L.stateOff(t.in[5], d, n + L.nLo) + k)]
                  : 0.0f;
          cPrev[size_t(n * H + k)] =
              L.has(t.in, 6)
                  ? t.in[6].data[size_t(L.stateOff(t.in[6], d, n + L.nLo) + k)]
                  : 0.0f;
        }
      std::vector<float> g(size_t(N * G));
      for (int64_t k = 0; k < T; ++k) {
        int64_t s = L.timeAt(d, k);
        // g = h_{t-1} R' plus the step's rows of X W' + biases.
        std::fill(g.begin(), g.end(), 0.0f);
        matmulAcc({g.data(), N, G, G, 1}, {hPrev.data(), N, H, H, 1},
                  MatView{r, G, H, H, 1}.t(), 1.0f);
        for (int64_t n = 0; n < N; ++n) {
          float *gr = gates + L.xRow(s, n + L.nLo) * G;
          const float *hr = g.data() + n * G;
          float *c = cs + (k * N + n) * H, *h = hs + (k * N + n) * H;
          for (int64_t u = 0; u < H; ++u) {
            float gi = sigmoid(gr[u] + hr[u]);
            float go = sigmoid(gr[H + u] + hr[H + u]);
            float gf = sigmoid(gr[2 * H + u] + hr[2 * H + u]);
            float gc = std::tanh(gr[3 * H + u] + hr[3 * H + u]);
            gr[u] = gi;
            gr[H + u] = go;
            gr[2 * H + u] = gf;
            gr[3 * H + u] = gc;
            c[u] = gf * cPrev[size_t(n * H + u)] + gi * gc;
            h[u] = go * std::tanh(c[u]);
          }
          if (L.has(t.out, 0))
            std::copy(h, h + H,
                      t.out[0].data.begin() +
                          L.yOff(t.out[0], s, d, n + L.nLo));
        }
        std::copy(hs + k * N * H, hs + (k + 1) * N * H, hPrev.begin());
        std::copy(cs + k * N * H, cs + (k + 1) * N * H, cPrev.begin());
      }
      for (int64_t n = 0; n < N; ++n)
        for (size_t o : {size_t(1), size_t(2)})
          if (L.has(t.out, o)) {
            const std::vector<float> &last = o == 1 ? hPrev : cPrev;
            std::copy(last.begin() + n * H, last.begin() + (n + 1) * H,
                      t.out[o].data.begin() +
                          L.stateOff(t.out[o], d, n + L.nLo));
          }
    }
  }
}

void lstmBackward(KernelCtx &ctx) {
  for (Task &t : ctx.tasks) {
    Lstm L(ctx.op, t);
    int64_t T = L.T, H = L.H, I = L.I, N = L.nCount, G = 4 * H;
    int64_t rows = T * N;
    const float *x = t.in[0].data.data();
    std::vector<float> dG(size_t(rows * G));
    std::vector<float> dh(size_t(N * H)), dc(size_t(N * H));
    std::vector<float> dhR(size_t(N * H));
    for (int64_t d = L.dLo; d < L.dLo + L.dCount; ++d) {
      int64_t dk = d - L.dLo;
      const float *w = t.in[1].data.data() + dk * G * I;
      const float *r = t.in[2].data.data() + dk * G * H;
      const float *gates = t.saved[0].data.data() + dk * rows * G;
      const float *cs = t.saved[1].data.data() + dk * T * N * H;
      const float *hs = t.saved[2].data.data() + dk * T * N * H;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t u = 0; u < H; ++u) {
          dh[size_t(n * H + u)] =
              L.has(t.gout, 1)
                  ? t.gout[1]
                        .data[size_t(L.stateOff(t.gout[1], d, n + L.nLo) + u)]
                  : 0.0f;
          dc[size_t(n * H + u)] =
              L.has(t.gout, 2)
                  ? t.gout[2]
                        .data[size_t(L.stateOff(t.gout[2], d, n + L.nLo) + u)]
                  : 0.0f;
        }
      auto prevState = [&](int in, const float *seq, int64_t k,
                           int64_t n) -> const float * {
        // The state before step k (sample n, relative): the initial state
        // (or zeros) before the first step.
        if (k > 0)
          return seq + ((k - 1) * N + n) * H;
        if (!L.has(t.in, size_t(in)))
          return nullptr;
        return t.in[size_t(in)].data.data() +
               L.stateOff(t.in[size_t(in)], d, n + L.nLo);
      };
      for (int64_t k = T - 1; k >= 0; --k) {
        int64_t s = L.timeAt(d, k);
        for (int64_t n = 0; n < N; ++n) {
          const float *gr = gates + L.xRow(s, n + L.nLo) * G;
          float *dg = dG.data() + L.xRow(s, n + L.nLo) * G;
          const float *c = cs + (k * N + n) * H;
          const float *cPrev = prevState(6, cs, k, n);
          float *dhn = dh.data() + n * H, *dcn = dc.data() + n * H;
          if (L.has(t.gout, 0)) {
            const float *dy =
                t.gout[0].data.data() + L.yOff(t.gout[0], s, d, n + L.nLo);
            for (int64_t u = 0; u < H; ++u)
              dhn[u] += dy[u];
          }
          for (int64_t u = 0; u < H; ++u) {
            float gi = gr[u], go = gr[H + u], gf = gr[2 * H + u],
                  gc = gr[3 * H + u];
            float tc = std::tanh(c[u]);
            float dC = dcn[u] + dhn[u] * go * (1 - tc * tc);
            float cp = cPrev ? cPrev[u] : 0.0f;
            dg[u] = dC * gc * gi * (1 - gi);
            dg[H + u] = dhn[u] * tc * go * (1 - go);
            dg[2 * H + u] = dC * cp * gf * (1 - gf);
            dg[3 * H + u] = dC * gi * (1 - gc * gc);
            dcn[u] = dC * gf;
          }
        }
        // dh_{t-1} = dG_t R; dR += dG_t' h_{t-1}.
        std::vector<float> dgStep(size_t(N * G));
        for (int64_t n = 0; n < N; ++n)
          std::copy(dG.begin() + L.xRow(s, n + L.nLo) * G,
                    dG.begin() + (L.xRow(s, n + L.nLo) + 1) * G,
                    dgStep.begin() + n * G);
        std::fill(dhR.begin(), dhR.end(), 0.0f);
        matmulAcc({dhR.data(), N, H, H, 1}, {dgStep.data(), N, G, G, 1},
                  {r, G, H, H, 1}, 1.0f);
        dh = dhR;
        if (L.has(t.gin, 2)) {
          std::vector<float> hp(size_t(N * H), 0.0f);
          for (int64_t n = 0; n < N; ++n)
            if (const float *p = prevState(5, hs, k, n))
              std::copy(p, p + H, hp.begin() + n * H);
          matmulAcc({t.gin[2].data.data() + dk * G * H, G, H, H, 1},
                    MatView{dgStep.data(), N, G, G, 1}.t(),
                    {hp.data(), N, H, H, 1}, 1.0f);
        }
      }
      // The first step's state gradients go to the initial states.
      for (int64_t n = 0; n < N; ++n)
        for (auto [in, v] :
             {std::pair<int, const std::vector<float> *>{5, &dh}, {6, &dc}})
          if (L.has(t.gin, size_t(in))) {
            float *p = t.gin[size_t(in)].data.data() +
                       L.stateOff(t.gin[size_t(in)], d, n + L.nLo);
            for (int64_t u = 0; u < H; ++u)
              p[u] += (*v)[size_t(n * H + u)];
          }
      // dX += dG W; dW += dG' X; both biases get the sum of dG.
      if (L.has(t.gin, 0))
        matmulAcc({t.gin[0].data.data(), rows, I, I, 1},
                  {dG.data(), rows, G, G, 1}, {w, G, I, I, 1}, 1.0f);
      if (L.has(t.gin, 1))
        matmulAcc({t.gin[1].data.data() + dk * G * I, G, I, I, 1},
                  MatView{dG.data(), rows, G, G, 1}.t(), {x, rows, I, I, 1},
                  1.0f);
      if (L.has(t.gin, 3)) {
        float *db = t.gin[3].data.data() + dk * 2 * G;
        for (int64_t q = 0; q < rows; ++q)
          for (int64_t k = 0; k < G; ++k) {
            db[k] += dG[size_t(q * G + k)];
            db[G + k] += dG[size_t(q * G + k)];
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
