// Discrete-event pipeline simulator.
//
// Lowering: the schedule becomes a DAG of tasks — compute tasks (F, B, W, optimizer) and transfer
// tasks (activation s→s+1 after F, gradient s+1→s after B, only between different devices) —
// with edges for (a) the per-device compute order, (b) data dependencies, (c) the FIFO order of
// each directed wire (transfers in the order their producers appear in the sender's order).
// Every resource is thus pre-ordered, and a task starts exactly when its last predecessor ends:
//   start(t) = max_{p ∈ pred(t)} end(p),  end = start + duration   (compute)
//   end = trace.finish_time(start + latency, bytes, bandwidth)     (transfer, trace at abs. time)
// Events (task completions) are processed in time order from a binary heap keyed (time, id);
// when a task's last predecessor completes it starts at that event's time. If the heap empties
// before every task ran, the remaining tasks wait on each other: a deadlock, reported per device.
// Flat arrays (CSR successors, pending counters) keep the loop allocation-free.
//
// Replica collectives (ReplicaCollectives) are tasks on a per-device communication stream (a FIFO
// in the order of the compute they serve) with two more kinds of dependency: a start edge (the
// successor may start once the predecessor has started: prefetch, a reduction that runs beside the
// backward making its gradients) and a finish-after dependency (a task ends no earlier than another
// task's end plus a fraction of its own duration: the overlapped collective's or compute's tail).
#include "weft/sim/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "weft/core/error.hpp"

namespace weft::sim {

using schedule::Op;
using schedule::OpKind;
using schedule::Schedule;

const char* task_kind_name(TaskKind k) {
  switch (k) {
    case TaskKind::F: return "F";
    case TaskKind::B: return "B";
    case TaskKind::W: return "W";
    case TaskKind::Optimizer: return "Opt";
    case TaskKind::SendActivation: return "act";
    case TaskKind::SendGradient: return "grad";
    case TaskKind::Gather: return "gather";
    case TaskKind::Reduce: return "reduce";
  }
  return "?";
}

namespace {

struct Lowered {
  std::vector<TaskKind> kind;
  std::vector<std::int32_t> stage, micro, device, peer, wire;
  std::vector<double> amount;  // duration (compute) or bytes (transfer)
  std::vector<std::int32_t> succ_begin, succ;
  std::vector<std::int32_t> ssucc_begin, ssucc;  // start edges: the successor may start once t started
  std::vector<std::int32_t> pending;
  // Finish-after: task t ends no earlier than end(fin_dep[t]) + fin_frac[t]·its own duration.
  std::vector<std::int32_t> fin_dep;
  std::vector<double> fin_frac;
  std::vector<std::int32_t> dev_begin;  // compute tasks of device d: [dev_begin[d], dev_begin[d+1])
  std::vector<std::int32_t> op_task;    // op index (stage, micro, kind) → task id
  std::vector<int> wire_link;           // wire → link index
};

std::size_t op_slot(int stage, int micro, OpKind k, int M) {
  return (static_cast<std::size_t>(stage) * static_cast<std::size_t>(M) + static_cast<std::size_t>(micro)) *
             3 +
         static_cast<std::size_t>(k);
}

}  // namespace

SimResult simulate(const Schedule& sch, const Pipeline& pipe, const SimOptions& opt) {
  const int S = sch.num_stages(), D = sch.num_devices(), M = sch.num_micro();
  const bool split = sch.split_backward();
  WEFT_CHECK(std::isfinite(opt.trace_offset), "simulate: trace_offset must be finite, got {}",
             opt.trace_offset);
  WEFT_CHECK(pipe.stages.size() == 1 || static_cast<int>(pipe.stages.size()) == S,
             "simulate: {} stage specs for {} stages (give 1 or {})", pipe.stages.size(), S, S);
  for (std::size_t i = 0; i < pipe.stages.size(); ++i) {
    const StageSpec& st = pipe.stages[i];
    for (double v : {st.forward_time, st.backward_time, st.weight_time, st.activation_bytes,
                     st.activation_memory, st.static_memory, st.optimizer_time})
      WEFT_CHECK(std::isfinite(v) && v >= 0, "simulate: stage spec {} has a negative or non-finite field", i);
    const ReplicaCollectives& rc = st.replica;
    for (double v : {rc.gather_forward, rc.gather_backward, rc.reduce_backward, rc.step_sync, rc.step_gather})
      WEFT_CHECK(std::isfinite(v) && v >= 0,
                 "simulate: stage spec {} has a negative or non-finite replica collective time", i);
    for (double u : {rc.gather_unit, rc.reduce_unit, rc.sync_unit})
      WEFT_CHECK(u > 0 && u <= 1, "simulate: stage spec {}'s replica overlap units must be in (0, 1], got {}",
                 i, u);
  }
  const int nl = static_cast<int>(pipe.links.size());
  WEFT_CHECK(nl == 0 || nl == 1 || nl == D - 1 || nl == D,
             "simulate: {} links for {} devices (give 0, 1, {} or {})", nl, D, D - 1, D);
  for (int i = 0; i < nl; ++i) {
    const LinkSpec& l = pipe.links[static_cast<std::size_t>(i)];
    WEFT_CHECK(l.bandwidth > 0 && !std::isnan(l.bandwidth), "simulate: link {} bandwidth must be > 0", i);
    WEFT_CHECK(std::isfinite(l.latency) && l.latency >= 0,
               "simulate: link {} latency must be finite and >= 0", i);
  }
  if (opt.check_pairing) {
    auto pc = schedule::check_pairing(sch);
    WEFT_CHECK(pc.ok, "simulate: {}", pc.to_string());
  }
  auto spec = [&](int s) -> const StageSpec& {
    return pipe.stages[pipe.stages.size() == 1 ? 0 : static_cast<std::size_t>(s)];
  };
  // Directed wire between devices a and b: link index * 2 + direction.
  auto wire_of = [&](int a, int b) -> int {
    if (nl == 0) return -1;
    int link = -1, dir = 0;
    if (b == a + 1)
      link = a;
    else if (a == b + 1)
      link = b, dir = 1;
    else if (a == D - 1 && b == 0)
      link = D - 1;
    else if (a == 0 && b == D - 1)
      link = D - 1, dir = 1;
    WEFT_CHECK(link >= 0, "simulate: devices {} and {} are not neighbours", a, b);
    WEFT_CHECK(nl == 1 || link < nl,
               "simulate: transfer between devices {} and {} needs link {} (only {} given)", a, b, link, nl);
    return link * 2 + dir;
  };

  // ---- lowering
  Lowered L;
  const std::size_t n_ops = sch.num_ops();
  const std::size_t n_est = n_ops + static_cast<std::size_t>(S) * (2 * static_cast<std::size_t>(M) + 1);
  for (auto* v : {&L.stage, &L.micro, &L.device, &L.peer, &L.wire}) v->reserve(n_est);
  L.kind.reserve(n_est);
  L.amount.reserve(n_est);
  L.op_task.assign(static_cast<std::size_t>(S) * static_cast<std::size_t>(M) * 3, -1);
  std::vector<std::int32_t> opt_task(static_cast<std::size_t>(S), -1);
  auto add_task = [&](TaskKind k, int s, int m, int d, int peer, int w, double amount) {
    L.kind.push_back(k);
    L.stage.push_back(s);
    L.micro.push_back(m);
    L.device.push_back(d);
    L.peer.push_back(peer);
    L.wire.push_back(w);
    L.amount.push_back(amount);
    return static_cast<std::int32_t>(L.kind.size() - 1);
  };
  for (int d = 0; d < D; ++d) {
    L.dev_begin.push_back(static_cast<std::int32_t>(L.kind.size()));
    for (const Op& op : sch.device_order(d)) {
      const StageSpec& st = spec(op.stage);
      double dur = op.kind == OpKind::F   ? st.forward_time
                   : op.kind == OpKind::W ? st.weight_time
                                          : st.backward_time + (split ? 0.0 : st.weight_time);
      L.op_task[op_slot(op.stage, op.micro, op.kind, M)] =
          add_task(static_cast<TaskKind>(op.kind), op.stage, op.micro, d, -1, -1, dur);
    }
    for (int s = 0; s < S; ++s)  // the stages the schedule's placement puts on d
      if (sch.device_of(s) == d)
        opt_task[static_cast<std::size_t>(s)] =
            add_task(TaskKind::Optimizer, s, -1, d, -1, -1, spec(s).optimizer_time);
  }
  L.dev_begin.push_back(static_cast<std::int32_t>(L.kind.size()));
  const std::int32_t n_compute = static_cast<std::int32_t>(L.kind.size());
  // transfers, in each sender's order; xfer_act[s*M+m] (s → s+1), xfer_grad[s*M+m] (s → s−1)
  std::vector<std::int32_t> xfer_act(static_cast<std::size_t>(S) * static_cast<std::size_t>(M), -1),
      xfer_grad(xfer_act);
  const int n_wires = nl == 0 ? 0 : 2 * D;  // wire = link * 2 + direction
  std::vector<std::pair<std::int32_t, std::int32_t>> edges;
  edges.reserve(n_est * 3);
  std::vector<std::int32_t> last_on_wire(static_cast<std::size_t>(n_wires), -1);
  auto add_xfer = [&](TaskKind k, int s, int m, int a, int b) {
    const int w = wire_of(a, b);
    if (w < 0) return std::int32_t{-1};
    const std::int32_t id =
        add_task(k, s, m, a, b, w, spec(k == TaskKind::SendActivation ? s : s - 1).activation_bytes);
    auto& last = last_on_wire[static_cast<std::size_t>(w)];
    if (last >= 0) edges.push_back({last, id});
    last = id;
    return id;
  };
  for (int d = 0; d < D; ++d) {
    for (const Op& op : sch.device_order(d)) {
      const std::size_t sm = static_cast<std::size_t>(op.stage) * static_cast<std::size_t>(M) +
                             static_cast<std::size_t>(op.micro);
      if (op.kind == OpKind::F && op.stage + 1 < S && sch.device_of(op.stage + 1) != d)
        xfer_act[sm] = add_xfer(TaskKind::SendActivation, op.stage, op.micro, d, sch.device_of(op.stage + 1));
      if (op.kind == OpKind::B && op.stage > 0 && sch.device_of(op.stage - 1) != d)
        xfer_grad[sm] = add_xfer(TaskKind::SendGradient, op.stage, op.micro, d, sch.device_of(op.stage - 1));
    }
  }
  const std::int32_t n_xfer_end = static_cast<std::int32_t>(L.kind.size());
  // Replica collectives, on each device's communication stream in the order of its compute.
  std::vector<std::pair<std::int32_t, std::int32_t>> sedges;                   // start edges
  std::vector<std::pair<std::int32_t, std::pair<std::int32_t, double>>> fins;  // t: (dep, fraction)
  {
    const OpKind grad_kind =
        split ? OpKind::W : OpKind::B;  // the op that completes a micro-batch's gradients
    std::vector<std::int32_t> last_grad_op(static_cast<std::size_t>(S), -1);
    for (int d = 0; d < D; ++d)
      for (const Op& op : sch.device_order(d))
        if (op.kind == grad_kind)
          last_grad_op[static_cast<std::size_t>(op.stage)] =
              L.op_task[op_slot(op.stage, op.micro, op.kind, M)];
    for (int d = 0; d < D; ++d) {
      std::int32_t last = -1, prev = -1;  // the stream's last collective, the previous compute task
      auto add_coll = [&](TaskKind k, int s, int m, double seconds) {
        const std::int32_t id = add_task(k, s, m, d, -1, -1, seconds);
        if (last >= 0) edges.push_back({last, id});
        last = id;
        return id;
      };
      for (const Op& op : sch.device_order(d)) {
        const ReplicaCollectives& rc = spec(op.stage).replica;
        const std::int32_t t = L.op_task[op_slot(op.stage, op.micro, op.kind, M)];
        const double g = op.kind == OpKind::F   ? rc.gather_forward
                         : op.kind == OpKind::B ? rc.gather_backward
                                                : 0.0;
        if (g > 0) {  // the first unit before the compute, the rest beside it
          const double u = rc.gather_unit;
          const std::int32_t g1 = add_coll(TaskKind::Gather, op.stage, op.micro, u * g);
          if (prev >= 0) (rc.prefetch ? sedges : edges).push_back({prev, g1});
          edges.push_back({g1, t});
          if (u < 1) fins.push_back({t, {add_coll(TaskKind::Gather, op.stage, op.micro, (1 - u) * g), u}});
        }
        if (op.kind == grad_kind) {
          std::int32_t r = -1;
          if (rc.reduce_backward > 0) {
            r = add_coll(TaskKind::Reduce, op.stage, op.micro, rc.reduce_backward);
            sedges.push_back({t, r});
            fins.push_back({r, {t, rc.reduce_unit}});
          }
          if (t == last_grad_op[static_cast<std::size_t>(op.stage)]) {
            if (rc.step_sync > 0) {
              const std::int32_t y = add_coll(TaskKind::Reduce, op.stage, -1, rc.step_sync);
              // After a per-micro-batch reduction the stream's order already puts it past the backward.
              if (r < 0) sedges.push_back({t, y}), fins.push_back({y, {t, rc.sync_unit}});
              r = y;
            }
            // The update waits for the stage's reduced gradients (the stream's last reduction).
            if (r >= 0) edges.push_back({r, opt_task[static_cast<std::size_t>(op.stage)]});
          }
        }
        prev = t;
      }
      for (int s = 0; s < S; ++s)
        if (sch.device_of(s) == d && spec(s).replica.step_gather > 0)
          edges.push_back({opt_task[static_cast<std::size_t>(s)],
                           add_coll(TaskKind::Gather, s, -1, spec(s).replica.step_gather)});
    }
  }
  const std::int32_t n = static_cast<std::int32_t>(L.kind.size());
  L.fin_dep.assign(static_cast<std::size_t>(n), -1);
  L.fin_frac.assign(static_cast<std::size_t>(n), 0.0);
  std::vector<std::int32_t> waiter(static_cast<std::size_t>(n), -1);  // the task whose end waits on t's
  for (const auto& [t, df] : fins) {
    L.fin_dep[static_cast<std::size_t>(t)] = df.first;
    L.fin_frac[static_cast<std::size_t>(t)] = df.second;
    WEFT_ASSERT(waiter[static_cast<std::size_t>(df.first)] < 0, "simulate: two tasks finish after one");
    waiter[static_cast<std::size_t>(df.first)] = t;
  }
  // edges
  for (int d = 0; d < D; ++d)
    for (std::int32_t t = L.dev_begin[static_cast<std::size_t>(d)] + 1;
         t < L.dev_begin[static_cast<std::size_t>(d) + 1]; ++t)
      edges.push_back({t - 1, t});
  auto task_of = [&](int s, int m, OpKind k) { return L.op_task[op_slot(s, m, k, M)]; };
  for (int s = 0; s < S; ++s) {
    for (int m = 0; m < M; ++m) {
      const std::size_t sm =
          static_cast<std::size_t>(s) * static_cast<std::size_t>(M) + static_cast<std::size_t>(m);
      const std::int32_t f = task_of(s, m, OpKind::F), b = task_of(s, m, OpKind::B);
      edges.push_back({f, b});
      if (split) edges.push_back({b, task_of(s, m, OpKind::W)});
      if (s + 1 < S) {  // activation s → s+1
        const std::int32_t x = xfer_act[sm], f2 = task_of(s + 1, m, OpKind::F);
        if (x >= 0)
          edges.push_back({f, x}), edges.push_back({x, f2});
        else
          edges.push_back({f, f2});
      }
      if (s > 0) {  // gradient s → s−1
        const std::int32_t x = xfer_grad[sm], b2 = task_of(s - 1, m, OpKind::B);
        if (x >= 0)
          edges.push_back({b, x}), edges.push_back({x, b2});
        else
          edges.push_back({b, b2});
      }
    }
  }
  // CSR
  L.pending.assign(static_cast<std::size_t>(n), 0);
  auto csr = [&](std::vector<std::pair<std::int32_t, std::int32_t>>& list, std::vector<std::int32_t>& begin,
                 std::vector<std::int32_t>& succ) {
    begin.assign(static_cast<std::size_t>(n) + 1, 0);
    for (const auto& [a, b] : list) {
      ++begin[static_cast<std::size_t>(a) + 1];
      ++L.pending[static_cast<std::size_t>(b)];
    }
    for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) begin[i + 1] += begin[i];
    succ.resize(list.size());
    std::vector<std::int32_t> fill(begin.begin(), begin.end() - 1);
    for (const auto& [a, b] : list) succ[static_cast<std::size_t>(fill[static_cast<std::size_t>(a)]++)] = b;
    list.clear();
    list.shrink_to_fit();
  };
  csr(edges, L.succ_begin, L.succ);
  csr(sedges, L.ssucc_begin, L.ssucc);

  // ---- event loop
  std::vector<double> start(static_cast<std::size_t>(n), -1.0), end(static_cast<std::size_t>(n), -1.0);
  std::vector<const cluster::BandwidthTrace*> wire_trace(static_cast<std::size_t>(n_wires));
  std::vector<double> wire_bw(static_cast<std::size_t>(n_wires)), wire_lat(static_cast<std::size_t>(n_wires));
  for (int w = 0; w < n_wires; ++w) {
    if (nl != 1 && w / 2 >= nl) continue;  // the wrap-around link was not given (never used)
    const LinkSpec& l = pipe.links[nl == 1 ? 0 : static_cast<std::size_t>(w / 2)];
    wire_trace[static_cast<std::size_t>(w)] = &l.trace;
    wire_bw[static_cast<std::size_t>(w)] = l.bandwidth;
    wire_lat[static_cast<std::size_t>(w)] = l.latency;
  }
  using Ev = std::pair<double, std::int32_t>;
  std::vector<Ev> heap;
  heap.reserve(static_cast<std::size_t>(std::min<std::int32_t>(n, 1 << 20)));
  const double off = opt.trace_offset;
  const cluster::BandwidthTrace& rtrace = pipe.replica_trace;
  // A task's end is settled (its completion event queued) once it has started and the task it
  // finishes after, if any, is settled too; settling one may settle its waiter.
  std::vector<double> dur(static_cast<std::size_t>(n), 0.0);  // own duration (end − start less any wait)
  std::vector<char> settled(static_cast<std::size_t>(n), 0);
  auto settle = [&](std::int32_t t) {
    for (; t >= 0; t = waiter[static_cast<std::size_t>(t)]) {
      const auto ti = static_cast<std::size_t>(t);
      const std::int32_t dep = L.fin_dep[ti];
      if (settled[ti] || start[ti] < 0 || (dep >= 0 && !settled[static_cast<std::size_t>(dep)])) return;
      end[ti] = start[ti] + dur[ti];
      if (dep >= 0)
        end[ti] = std::max(end[ti], end[static_cast<std::size_t>(dep)] + L.fin_frac[ti] * dur[ti]);
      settled[ti] = 1;
      heap.emplace_back(end[ti], t);
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    }
  };
  // Seconds to move `amount` at nominal rate `rate` from time t under a trace (read at absolute time).
  auto on_trace = [&](const cluster::BandwidthTrace& tr, double t, double amount, double rate) {
    return tr.is_constant() ? amount / (rate * tr.fractions()[0])
                            : tr.transfer_seconds(t + off, amount, rate);
  };
  std::vector<std::int32_t> ready;  // tasks whose last predecessor (or start edge) has fired
  auto launch = [&](std::int32_t t, double now) {
    const auto ti = static_cast<std::size_t>(t);
    double e;
    if (t < n_compute) {
      e = now + L.amount[ti];
    } else if (t >= n_xfer_end) {  // a replica collective: seconds at nominal bandwidth
      const double secs = L.amount[ti];
      e = secs == 0 ? now : now + on_trace(rtrace, now, secs, 1.0);
    } else {
      const auto w = static_cast<std::size_t>(L.wire[ti]);
      const double bytes = L.amount[ti];
      e = now + wire_lat[w];
      if (bytes != 0 && wire_bw[w] < 1e299) e += on_trace(*wire_trace[w], e, bytes, wire_bw[w]);
    }
    start[ti] = now;
    dur[ti] = e - now;
    settle(t);
    for (std::int32_t i = L.ssucc_begin[ti]; i < L.ssucc_begin[ti + 1]; ++i) {
      const std::int32_t s = L.ssucc[static_cast<std::size_t>(i)];
      if (--L.pending[static_cast<std::size_t>(s)] == 0) ready.push_back(s);
    }
  };
  // Start edges fire at the start, so a launch may make others ready at the same instant.
  auto launch_ready = [&](double now) {
    while (!ready.empty()) {
      const std::int32_t t = ready.back();
      ready.pop_back();
      launch(t, now);
    }
  };
  for (std::int32_t t = 0; t < n; ++t)
    if (L.pending[static_cast<std::size_t>(t)] == 0) ready.push_back(t);
  std::reverse(ready.begin(), ready.end());  // launched in id order
  launch_ready(0.0);
  std::size_t events = 0;
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const auto [now, t] = heap.back();
    heap.pop_back();
    ++events;
    for (std::int32_t i = L.succ_begin[static_cast<std::size_t>(t)];
         i < L.succ_begin[static_cast<std::size_t>(t) + 1]; ++i) {
      const std::int32_t s = L.succ[static_cast<std::size_t>(i)];
      if (--L.pending[static_cast<std::size_t>(s)] == 0) ready.push_back(s);
    }
    launch_ready(now);
  }

  // ---- results
  SimResult r;
  r.events = events;
  r.num_tasks = static_cast<std::size_t>(n);
  r.busy_time.assign(static_cast<std::size_t>(D), 0.0);
  r.collective_time.assign(static_cast<std::size_t>(D), 0.0);
  for (std::int32_t t = 0; t < n; ++t) {
    const auto ti = static_cast<std::size_t>(t);
    if (!settled[ti] || (t >= n_compute && t < n_xfer_end)) continue;
    r.step_time = std::max(r.step_time, end[ti]);
    (t < n_compute ? r.busy_time : r.collective_time)[static_cast<std::size_t>(L.device[ti])] += dur[ti];
  }
  double busy = 0;
  for (double b : r.busy_time) busy += b;
  r.bubble_fraction = r.step_time > 0 ? 1.0 - busy / (static_cast<double>(D) * r.step_time) : 0.0;
  r.peak_in_flight = sch.peak_in_flight();
  r.peak_in_flight_device = sch.peak_in_flight_device();
  r.peak_memory.assign(static_cast<std::size_t>(D), 0.0);
  {
    const OpKind last = split ? OpKind::W : OpKind::B;
    for (int d = 0; d < D; ++d) {
      double stat = 0, cur = 0, peak = 0;
      for (int s = 0; s < S; ++s)
        if (sch.device_of(s) == d) stat += spec(s).static_memory;
      for (const Op& op : sch.device_order(d)) {
        if (op.kind == OpKind::F) peak = std::max(peak, cur += spec(op.stage).activation_memory);
        if (op.kind == last) cur -= spec(op.stage).activation_memory;
      }
      r.peak_memory[static_cast<std::size_t>(d)] = stat + peak;
    }
  }
  if (events < static_cast<std::size_t>(n)) {
    r.deadlock = true;
    r.step_time = std::numeric_limits<double>::infinity();
    r.bubble_fraction = 1.0;
    std::string rep =
        fmt::format("deadlock: {} of {} tasks never ran;", static_cast<std::size_t>(n) - events, n);
    auto name = [&](std::int32_t t) {
      const auto ti = static_cast<std::size_t>(t);
      if (L.kind[ti] == TaskKind::Optimizer) return fmt::format("Opt(s{})", L.stage[ti]);
      return fmt::format("{}(s{},m{})", task_kind_name(L.kind[ti]), L.stage[ti], L.micro[ti]);
    };
    for (int d = 0; d < D; ++d) {
      for (std::int32_t t = L.dev_begin[static_cast<std::size_t>(d)];
           t < L.dev_begin[static_cast<std::size_t>(d) + 1]; ++t) {
        const auto ti = static_cast<std::size_t>(t);
        if (start[ti] >= 0) continue;
        std::string waits;
        if (L.kind[ti] != TaskKind::Optimizer) {
          const int s = L.stage[ti], m = L.micro[ti];
          auto need = [&](std::int32_t p) {
            if (p >= 0 && end[static_cast<std::size_t>(p)] < 0) waits += " " + name(p);
          };
          const std::size_t sm =
              static_cast<std::size_t>(s) * static_cast<std::size_t>(M) + static_cast<std::size_t>(m);
          if (L.kind[ti] == TaskKind::F && s > 0)
            need(xfer_act[sm - static_cast<std::size_t>(M)] >= 0 ? xfer_act[sm - static_cast<std::size_t>(M)]
                                                                 : task_of(s - 1, m, OpKind::F));
          if (L.kind[ti] == TaskKind::B) {
            need(task_of(s, m, OpKind::F));
            if (s + 1 < S)
              need(xfer_grad[sm + static_cast<std::size_t>(M)] >= 0
                       ? xfer_grad[sm + static_cast<std::size_t>(M)]
                       : task_of(s + 1, m, OpKind::B));
          }
          if (L.kind[ti] == TaskKind::W) need(task_of(s, m, OpKind::B));
        }
        rep += fmt::format(" device {} blocked at {}{}{};", d, name(t), waits.empty() ? "" : " waiting for",
                           waits);
        break;
      }
    }
    r.deadlock_report = rep;
  }
  if (opt.record_timeline) {
    r.timeline.reserve(static_cast<std::size_t>(n));
    for (std::int32_t t = 0; t < n; ++t) {
      const auto ti = static_cast<std::size_t>(t);
      if (!settled[ti]) continue;
      r.timeline.push_back(
          {L.kind[ti], L.stage[ti], L.micro[ti], L.device[ti], L.peer[ti], start[ti], end[ti]});
    }
  }
  return r;
}

std::string SimResult::to_chrome_trace() const {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  auto sep = [&]() {
    if (!first) out += ",";
    first = false;
  };
  int max_dev = -1;
  for (const auto& e : timeline) max_dev = std::max(max_dev, std::max(e.device, e.peer));
  for (int d = 0; d <= max_dev; ++d) {
    sep();
    out += fmt::format(R"({{"name":"thread_name","ph":"M","pid":0,"tid":{},"args":{{"name":"device {}"}}}})",
                       d, d);
  }
  sep();
  out += R"({"name":"process_name","ph":"M","pid":0,"args":{"name":"compute"}})";
  sep();
  out +=
      R"({"name":"process_name","ph":"M","pid":1,"args":{"name":"transfers: tid = 1000*sender+receiver"}})";
  sep();
  out += R"({"name":"process_name","ph":"M","pid":2,"args":{"name":"replica collectives: tid = device"}})";
  for (const auto& e : timeline) {
    sep();
    const bool xfer = e.peer >= 0;
    const bool coll = e.kind == TaskKind::Gather || e.kind == TaskKind::Reduce;
    const std::string nm = e.kind == TaskKind::Optimizer ? std::string("Opt")
                           : e.micro < 0                 ? std::string(task_kind_name(e.kind))
                                         : fmt::format("{}{}", task_kind_name(e.kind), e.micro);
    out += fmt::format(
        R"({{"name":"{}","cat":"{}","ph":"X","ts":{:.6f},"dur":{:.6f},"pid":{},"tid":{},"args":{{"stage":{},"micro":{}}}}})",
        nm, task_kind_name(e.kind), e.start * 1e6, (e.end - e.start) * 1e6,
        coll   ? 2
        : xfer ? 1
               : 0,
        xfer ? e.device * 1000 + e.peer : e.device, e.stage, e.micro);
  }
  out += "]}";
  return out;
}

std::string SimResult::to_string() const {
  if (deadlock) return fmt::format("SimResult(DEADLOCK, {} of {} tasks ran)", events, num_tasks);
  int pk = 0;
  for (int p : peak_in_flight_device) pk = std::max(pk, p);
  return fmt::format("SimResult(step {:.6g}, bubble {:.3f}, peak in-flight {}, {} tasks)", step_time,
                     bubble_fraction, pk, num_tasks);
}

}  // namespace weft::sim
