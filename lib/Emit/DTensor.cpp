// soapc emit --target dtensor (include/soap/Emit/DTensor.h): the plan's
// layout (DTensorLayout.h) as a PLAN dictionary above the generic runtime
// (dtensor_runtime.py, embedded at build time).
#include "soap/Emit/DTensor.h"

#include "DTensorLayout.h"
#include "soap/Emit/EngineLayout.h"
#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <fmt/format.h>
#include <map>
#include <set>

namespace soap {

namespace {

#include "DTensorRuntime.inc"

Json placementsJson(const Placements &p) { return Json(p); }

/// The collectives DTensor issues to take a value from `from` to `to`, one
/// per mesh dimension that changes, counted into `n` by kind.
void countRedistribute(const Placements &from, const Placements &to,
                       std::map<std::string, int64_t> &n) {
  for (size_t j = 0; j < from.size() && j < to.size(); ++j) {
    const std::string &a = from[j], &b = to[j];
    if (a == b || a == "R")
      continue; // Replicate -> Shard or Partial: local
    if (a == "P")
      ++n[b == "R" ? "all_reduce" : "reduce_scatter"];
    else
      ++n[b == "R" ? "all_gather" : "all_to_all"];
  }
}

/// An input's gradient under `p`: a partial sum on each mesh dimension
/// that splits a loop the input's map lacks.
Placements gradPlacements(const Op &op, const OpPlacement &p, size_t i) {
  Placements g = p.inputs[i];
  std::vector<int> missing = op.sem.loopsMissingFrom(op.sem.inputs[i]);
  for (size_t j = 0; j < p.loopOfDim.size(); ++j)
    for (int l : missing)
      if (p.loopOfDim[j] == l)
        g[j] = "P";
  return g;
}

/// The gradient a producer's output of placement `out` receives, taken
/// back from a consumer's `grad`.
Placements gradTarget(const Placements &out) {
  Placements t = out;
  for (std::string &x : t)
    if (x == "P")
      x = "R";
  return t;
}

/// The PLAN dictionary as JSON a reader can follow: a field per line, and a
/// line per element of a list of objects (an op, a weight, an input).
std::string planText(const Json &plan) {
  std::string out = "{";
  bool first = true;
  for (const auto &[key, value] : plan.items()) {
    out += (first ? "\n \"" : ",\n \"") + key + "\": ";
    first = false;
    if (value.is_array() && !value.empty() && value.front().is_object()) {
      out += "[";
      for (size_t k = 0; k < value.size(); ++k)
        out += (k ? ",\n  " : "\n  ") + value[k].dump();
      out += "\n ]";
    } else {
      out += value.dump();
    }
  }
  return out + "\n}";
}

} // namespace

llvm::Expected<Emitted> emitDTensor(const EmitContext &c) {
  const Graph &g = c.graph;
  const Strategy &s = c.strategy;
  auto layoutOr = dtensorLayout(c);
  if (!layoutOr)
    return layoutOr.takeError();
  const DTensorLayout &l = *layoutOr;
  Emitted e;
  bool pipelined = s.pipeline.numStages() > 1;

  Json plan;
  plan["plan"] = c.planPath;
  // Absolute, so that the program runs from any directory.
  llvm::SmallString<256> model(c.modelPath);
  llvm::sys::fs::make_absolute(model);
  llvm::sys::path::remove_dots(model, true);
  plan["model"] = std::string(model);
  plan["batch"] = c.plan.inputs.batch;
  plan["optimizer"] = c.plan.inputs.optimizer;
  plan["devices"] = int64_t(c.topo.numDevices());
  plan["mesh"] = l.mesh;
  plan["groups"] = l.groups;
  plan["stages"] = s.pipeline.numStages();
  plan["micro_batches"] = s.pipeline.microBatches;
  plan["schedule"] = scheduleName(s.pipeline.schedule).str();
  plan["chunks"] = s.pipeline.chunks;
  if (c.plan.inputs.precision != "fp32")
    e.notes.push_back(fmt::format("the plan is {}; the program trains in fp32",
                                  c.plan.inputs.precision));

  // Ops, and the values whose placement each producer and consumer wants.
  std::map<ValueId, Placements> produced;
  Json ops = Json::array();
  std::vector<std::string> fallbacks;
  for (const Op &op : g.ops()) {
    const OpPlacement &p = l.ops[size_t(op.id)];
    Json o;
    o["op"] = op.name;
    o["kind"] = op.kind;
    o["stage"] = s.pipeline.stage(op.id);
    o["recompute"] = s.recomputes(op.id);
    Json in = Json::object(), out = Json::object();
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (op.inputs[i] != kNoValue && !p.inputs[i].empty())
        in[g.value(op.inputs[i]).name] = placementsJson(p.inputs[i]);
    for (size_t j = 0; j < op.outputs.size(); ++j)
      if (op.outputs[j] != kNoValue) {
        out[g.value(op.outputs[j]).name] = placementsJson(p.outputs[j]);
        produced[op.outputs[j]] = p.outputs[j];
      }
    o["inputs"] = in;
    o["outputs"] = out;
    if (!p.fallback.empty()) {
      o["fallback"] = p.fallback;
      fallbacks.push_back(
          fmt::format("op '{}' ({}): {}", op.name, op.kind, p.fallback));
    }
    ops.push_back(o);
  }

  // Weights: drawn as soap-run draws them, held in their first user's
  // placement (its home); ZeRO-3 weights of data-parallel ops go to FSDP2.
  Json weights = Json::array();
  std::map<std::string, int64_t> expect = {{"all_reduce", 0},
                                           {"all_gather", 0},
                                           {"reduce_scatter", 0},
                                           {"all_to_all", 0}};
  // Per FSDP module (its first user's op), the ops that read its weights.
  std::map<int64_t, std::set<OpId>> fsdpOps;
  for (const Value &v : g.values()) {
    if (v.kind != ValueKind::Weight || v.users.empty())
      continue;
    const Op &first = g.op(v.users.front());
    size_t idx = 0;
    while (first.inputs[idx] != v.id)
      ++idx;
    Placements home = l.ops[size_t(first.id)].inputs[idx];
    bool scale = false;
    for (OpId u : v.users) {
      const Op &uo = g.op(u);
      if ((uo.kind == "BatchNormalization" ||
           uo.kind == "LayerNormalization") &&
          uo.input(1) == v.id)
        scale = true;
    }
    Json w;
    w["name"] = v.name;
    w["shape"] = v.shape.dims;
    w["view"] = v.shape.dims;
    w["init"] = scale ? "scale" : "default";
    w["home"] = home;
    w["fsdp"] = nullptr;
    bool replicated =
        std::all_of(home.begin(), home.end(),
                    [](const std::string &x) { return x == "R"; });
    if (weightZeroStage(g, s, v.id) == 3) {
      if (replicated && !pipelined && c.topo.numDevices() > 1) {
        w["fsdp"] = int64_t(first.id);
        fsdpOps[first.id].insert(v.users.begin(), v.users.end());
      } else {
        fallbacks.push_back(fmt::format(
            "weight '{}': ZeRO-3 kept whole ({}); FSDP2 here shards the "
            "weights of data-parallel ops outside a pipeline",
            v.name, placementsStr(home)));
      }
    }
    // Its gradient, summed over the users' partial sums, comes home.
    if (w["fsdp"].is_null()) {
      Placements grad = home;
      for (OpId u : v.users) {
        const Op &uo = g.op(u);
        for (size_t i = 0; i < uo.inputs.size(); ++i)
          if (uo.inputs[i] == v.id) {
            Placements gp = gradPlacements(uo, l.ops[size_t(u)], i);
            for (size_t j = 0; j < gp.size(); ++j)
              if (gp[j] == "P")
                grad[j] = "P";
          }
      }
      countRedistribute(grad, home, expect);
    }
    weights.push_back(w);
  }
  // Each FSDP module, every micro-batch: its weights all-gathered for the
  // forward and again for the backward of each op that reads them, the
  // gradients reduce-scattered.
  for (const auto &[op, users] : fsdpOps) {
    expect["all_gather"] += 2 * int64_t(users.size()) * s.pipeline.microBatches;
    expect["reduce_scatter"] += s.pipeline.microBatches;
  }

  // Graph inputs, drawn whole on every rank, cut to their first user's
  // placement; the integer ones draw from the range their users index.
  std::map<ValueId, int64_t> range;
  const Op *lossOp = nullptr;
  for (const Op &op : g.ops()) {
    auto note = [&](size_t i, int64_t r) {
      if (op.input(i) == kNoValue)
        return;
      auto [it, fresh] = range.emplace(op.input(i), r);
      if (!fresh)
        it->second = std::min(it->second, r);
    };
    if (op.kind == "SoftmaxCrossEntropyLoss") {
      lossOp = &op;
      const TensorShape &scores = g.value(op.inputs[0]).shape;
      int64_t axis = op.getInt("class_axis", 1);
      if (axis < 0)
        axis += int64_t(scores.rank());
      note(1, scores[size_t(axis)]);
    }
    if (op.kind == "Gather" && !op.sem.inputs[1].dims.empty())
      note(1, g.value(op.inputs[0]).shape[0]);
  }
  if (!lossOp)
    return planError(c, "/ops",
                     "the model has no SoftmaxCrossEntropyLoss; a DTensor "
                     "program trains the loss soapc appends");
  if (lossOp->name != "soapc.loss")
    return opError(c, lossOp->id, "",
                   "is the model's own loss; a DTensor program trains the "
                   "loss soapc appends (import without one in the file)");
  Json inputs = Json::array();
  for (ValueId id : g.inputs) {
    const Value &v = g.value(id);
    Placements home(l.mesh.size(), "R");
    for (OpId u : v.users) {
      const Op &uo = g.op(u);
      for (size_t i = 0; i < uo.inputs.size(); ++i)
        if (uo.inputs[i] == id) {
          home = l.ops[size_t(u)].inputs[i];
          break;
        }
      break;
    }
    produced[id] = home;
    Json in;
    in["name"] = v.name;
    in["shape"] = v.shape.dims;
    auto r = range.find(id);
    in["range"] = r == range.end() ? 0 : r->second;
    in["placement"] = home;
    inputs.push_back(in);
  }
  const OpPlacement &lp = l.ops[size_t(lossOp->id)];
  Json loss;
  loss["logits"] = g.value(lossOp->inputs[0]).name;
  loss["labels"] = g.value(lossOp->inputs[1]).name;
  loss["placement"] = lp.inputs[0];
  loss["labels_placement"] = lp.inputs[1];

  // The collectives of the plan's data movement, for each micro-batch:
  // each consumer's input taken from its producer's placement, its
  // gradient taken back; the loss made whole. The weight gradients
  // (above) are synchronised once a step.
  std::map<std::string, int64_t> perMicro;
  auto readsGrad = [&](const Op &op, size_t i) {
    ValueId v = op.inputs[i];
    return g.value(v).needsGrad && g.value(v).kind == ValueKind::Activation;
  };
  // The inputs each op takes from a producer: once per value and
  // placement (the runtime redistributes a value once per op).
  auto takes = [&](const Op &op, auto f) {
    const OpPlacement &p = l.ops[size_t(op.id)];
    std::set<std::pair<ValueId, Placements>> seen;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      ValueId v = op.inputs[i];
      auto src = produced.find(v);
      if (v == kNoValue || src == produced.end() || p.inputs[i].empty() ||
          !seen.emplace(v, p.inputs[i]).second)
        continue;
      f(i, src->second);
    }
  };
  for (const Op &op : g.ops())
    takes(op, [&](size_t i, const Placements &src) {
      const Placements &want = l.ops[size_t(op.id)].inputs[i];
      if (src != want)
        countRedistribute(src, want, perMicro);
    });
  // The backward, consumers before producers. Per value, the gradient
  // that consumers reading it as produced add up (no redistribution of
  // theirs to take back), reduced where it reaches its producer: partial
  // on a mesh dimension where any of them is. A layout op (Reshape,
  // Transpose, ...) passes a partial gradient on to its input unreduced,
  // as DTensor's view rules keep Partial(): it is reduced where that
  // input's own redistribution is taken back (an LM head's input gradient
  // reduce-scattered to the sequence-parallel LayerNorm before it).
  std::map<ValueId, Placements> merged;
  for (auto it = g.ops().rbegin(); it != g.ops().rend(); ++it) {
    const Op &op = *it;
    const OpPlacement &p = l.ops[size_t(op.id)];
    Placements carried(l.mesh.size(), "R");
    if (isLayoutKind(op.kind) && op.outputs.size() == 1 &&
        op.inputs.size() >= 1 && op.inputs[0] != kNoValue && readsGrad(op, 0)) {
      auto m = merged.find(op.outputs[0]);
      if (m != merged.end()) {
        Placements home = gradTarget(produced[op.outputs[0]]);
        for (size_t j = 0; j < carried.size(); ++j)
          if (m->second[j] == "P") {
            carried[j] = "P";
            m->second[j] = home[j]; // not reduced here
          }
      }
    }
    takes(op, [&](size_t i, const Placements &src) {
      if (!readsGrad(op, i))
        return;
      Placements gp = gradPlacements(op, p, i);
      for (size_t j = 0; j < gp.size(); ++j)
        if (carried[j] == "P" && i == 0)
          gp[j] = "P";
      if (src != p.inputs[i]) {
        countRedistribute(gp, gradTarget(src), perMicro);
        return;
      }
      auto [m, fresh] = merged.emplace(op.inputs[i], gp);
      for (size_t j = 0; !fresh && j < gp.size(); ++j)
        if (gp[j] == "P")
          m->second[j] = "P";
    });
  }
  for (const auto &[v, gp] : merged)
    countRedistribute(gp, gradTarget(produced[v]), perMicro);
  // BatchNorm over a split batch: its mean and variance summed in the
  // forward, the two sums of its backward too.
  for (const Op &op : g.ops())
    if (op.kind == "BatchNormalization")
      for (int lp : l.ops[size_t(op.id)].loopOfDim)
        if (lp >= 0 && op.sem.loops[size_t(lp)].statReduced)
          perMicro["all_reduce"] += 4;
  // The loss: split classes combine the row maximum, the sum of
  // exponentials and the picked logit; split rows add up the loss.
  std::string classDim =
      fmt::format("S{}", g.value(lossOp->inputs[0]).shape.rank() - 1);
  for (const std::string &x : lp.inputs[0])
    perMicro["all_reduce"] += x == classDim ? 3 : x != "R" ? 1 : 0;
  for (const auto &[kind, n] : perMicro)
    expect[kind] += n * s.pipeline.microBatches;

  Json fb = Json::array();
  for (const std::string &f : fallbacks)
    fb.push_back(f);
  plan["ops"] = ops;
  plan["weights"] = weights;
  plan["inputs"] = inputs;
  plan["loss"] = loss;
  plan["fallbacks"] = fb;
  plan["collectives"] = fallbacks.empty() ? Json(expect) : Json(nullptr);

  e.text = "#!/usr/bin/env python3\n"
           "# A PyTorch DTensor program written by `soapc emit --target "
           "dtensor` for " +
           c.planPath + "; run it with\n#   torchrun --nproc-per-node " +
           std::to_string(c.topo.numDevices()) +
           " THIS.py --steps 3\n# (or with one process: the same training "
           "on one device).\nimport json\n\nPLAN = json.loads(r\"\"\"\n" +
           planText(plan) + "\n\"\"\")\n\n" + kDTensorRuntime;
  for (const std::string &f : fallbacks)
    e.notes.push_back(fmt::format("DTensor fallback: {}", f));
  return e;
}

} // namespace soap
