// Convolution tiles through oneDNN: a tile of a Conv (any box of its
// samples, groups, channels, output positions and window) is itself a
// convolution of its buffers, with the padding that the clamped input
// region leaves on each side, so oneDNN's forward, backward-data and
// backward-weights primitives compute it directly on the task's buffers.
#include "Gemm.h"

#include <algorithm>
#ifdef SOAP_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace soap {
namespace exec {

#ifdef SOAP_HAVE_DNNL
namespace {

using dnnl::memory;
using Dims = memory::dims;

dnnl::engine &engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

/// A tile of a convolution as oneDNN sees it.
struct ConvShape {
  Dims src, wei, dst, strides, dilates, padL, padR;
};

memory::format_tag plainTag(size_t rank) {
  switch (rank) {
  case 3:
    return memory::format_tag::abc;
  case 4:
    return memory::format_tag::abcd;
  case 5:
    return memory::format_tag::abcde;
  default:
    return memory::format_tag::abcdef;
  }
}

memory::desc plainDesc(const Dims &d) {
  return memory::desc(d, memory::data_type::f32, plainTag(d.size()));
}

/// The tile's convolution, from the Conv semantics' loop order (n, [g],
/// oc, ic, spatial outputs, window) and the input map's strides,
/// dilations and padding; false for shapes oneDNN does not take.
bool describeConv(const OpSemantics &sem, const Task &t, const Buf &y,
                  ConvShape &c) {
  const TensorMap &xm = sem.inputs[0];
  size_t nsp = xm.dims.size() - 2;
  if (nsp < 1 || nsp > 3 || t.in[0].box.empty())
    return false;
  bool grouped = sem.loops.size() == 3 + 2 * nsp + 1;
  size_t first = grouped ? 4 : 3; // first spatial output loop
  const Box &tile = t.loops, &xb = t.in[0].box;
  auto ext = [&](size_t l) { return tile.hi[l] - tile.lo[l]; };
  int64_t groups = grouped ? ext(1) : 1;
  int64_t oc = ext(grouped ? 2 : 1), ic = ext(grouped ? 3 : 2);
  c.src = {ext(0), groups * ic};
  c.dst = {ext(0), groups * oc};
  c.wei = grouped ? Dims{groups, oc, ic} : Dims{oc, ic};
  for (size_t i = 0; i < nsp; ++i) {
    const DimMap &d = xm.dims[2 + i];
    if (d.divisor != 1 || d.terms.size() != 2)
      return false;
    size_t o = first + i, k = first + nsp + i;
    int64_t s = d.terms[0].coeff, dil = d.terms[1].coeff;
    if (size_t(d.terms[0].loop) != o || size_t(d.terms[1].loop) != k || s < 1 ||
        dil < 1)
      return false;
    int64_t lo = tile.lo[o] * s + tile.lo[k] * dil + d.offset;
    int64_t hi = (tile.hi[o] - 1) * s + (tile.hi[k] - 1) * dil + d.offset;
    int64_t padL = xb.lo[2 + i] - lo, padR = hi - (xb.hi[2 + i] - 1);
    if (padL < 0 || padR < 0)
      return false;
    c.src.push_back(xb.hi[2 + i] - xb.lo[2 + i]);
    c.dst.push_back(ext(o));
    c.wei.push_back(ext(k));
    c.strides.push_back(s);
    c.dilates.push_back(dil - 1);
    c.padL.push_back(padL);
    c.padR.push_back(padR);
  }
  // The buffers must hold exactly these boxes (channels of the tile's
  // groups contiguous): true of the executor's regions.
  auto vol = [](const Dims &d) {
    int64_t v = 1;
    for (int64_t x : d)
      v *= x;
    return v;
  };
  return vol(c.src) == int64_t(t.in[0].size()) &&
         vol(c.wei) == int64_t(t.in[1].size()) &&
         vol(c.dst) == int64_t(y.size());
}

dnnl::convolution_forward::primitive_desc forwardPd(const ConvShape &c) {
  dnnl::convolution_forward::desc d(
      dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
      plainDesc(c.src), plainDesc(c.wei), plainDesc(c.dst), c.strides,
      c.dilates, c.padL, c.padR);
  return {d, engine()};
}

memory mem(const Dims &d, const float *p) {
  return memory(plainDesc(d), engine(), const_cast<float *>(p));
}

} // namespace

bool convForward(const OpSemantics &sem, Task &t) {
  ConvShape c;
  if (!describeConv(sem, t, t.out[0], c))
    return false;
  try {
    auto pd = forwardPd(c);
    dnnl::stream s(engine());
    dnnl::convolution_forward(pd).execute(
        s, {{DNNL_ARG_SRC, mem(c.src, t.in[0].data.data())},
            {DNNL_ARG_WEIGHTS, mem(c.wei, t.in[1].data.data())},
            {DNNL_ARG_DST, mem(c.dst, t.out[0].data.data())}});
    s.wait();
  } catch (const dnnl::error &) {
    return false; // a shape no implementation takes: the GEMM path runs
  }
  return true;
}

bool convBackward(const OpSemantics &sem, Task &t) {
  ConvShape c;
  if (!describeConv(sem, t, t.gout[0], c))
    return false;
  try {
    auto fwd = forwardPd(c);
    dnnl::stream s(engine());
    memory dy = mem(c.dst, t.gout[0].data.data());
    // oneDNN writes its results; the gradient buffers are fresh zeros that
    // only this kernel fills, so writing equals adding.
    if (t.gin[0].size() > 0) {
      dnnl::convolution_backward_data::desc d(
          dnnl::algorithm::convolution_direct, plainDesc(c.src),
          plainDesc(c.wei), plainDesc(c.dst), c.strides, c.dilates, c.padL,
          c.padR);
      dnnl::convolution_backward_data::primitive_desc pd(d, engine(), fwd);
      dnnl::convolution_backward_data(pd).execute(
          s, {{DNNL_ARG_DIFF_DST, dy},
              {DNNL_ARG_WEIGHTS, mem(c.wei, t.in[1].data.data())},
              {DNNL_ARG_DIFF_SRC, mem(c.src, t.gin[0].data.data())}});
    }
    if (t.gin[1].size() > 0) {
      dnnl::convolution_backward_weights::desc d(
          dnnl::algorithm::convolution_direct, plainDesc(c.src),
          plainDesc(c.wei), plainDesc(c.dst), c.strides, c.dilates, c.padL,
          c.padR);
      dnnl::convolution_backward_weights::primitive_desc pd(d, engine(), fwd);
      dnnl::convolution_backward_weights(pd).execute(
          s, {{DNNL_ARG_DIFF_DST, dy},
              {DNNL_ARG_SRC, mem(c.src, t.in[0].data.data())},
              {DNNL_ARG_DIFF_WEIGHTS, mem(c.wei, t.gin[1].data.data())}});
    }
    s.wait();
  } catch (const dnnl::error &) {
    // The GEMM path runs instead, from zeros again.
    for (int i : {0, 1})
      std::fill(t.gin[i].data.begin(), t.gin[i].data.end(), 0.0f);
    return false;
  }
  return true;
}

#else

bool convForward(const OpSemantics &, Task &) { return false; }
bool convBackward(const OpSemantics &, Task &) { return false; }

#endif

} // namespace exec
} // namespace soap
