// ILP facade over COIN-OR CBC's C++ API.
//
//   minimise c·x + offset  s.t.  A x (<=,>=,==) b,  lb <= x <= ub,  x_j ∈ Z for integer columns.
//
// The model is loaded column by column into a fresh OsiClpSolverInterface per solve (no state
// survives a call) and solved by CBC's stand-alone driver (CbcMain0/CbcMain1, the branch and cut
// CBC's C interface runs), single-threaded with a fixed seed. The deadline (IlpOptions::stop with
// time_limit_s folded in) is watched from inside: a CLP event handler checks it after every
// simplex iteration (CBC's own time limit never looks inside an LP, and the root relaxation of a
// large model can take many seconds), a CBC event handler at every node. The answer is re-scored
// with Ilp::evaluate so the reported objective never depends on CBC's rounding.
#include "weft/solver/ilp.hpp"

#include <CbcEventHandler.hpp>
#include <CbcModel.hpp>
#include <CbcSolver.hpp>
#include <ClpEventHandler.hpp>
#include <ClpSimplex.hpp>
#include <ClpSolve.hpp>
#include <OsiClpSolverInterface.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <string>

#include "weft/core/error.hpp"

// CBC's command-line driver keeps its parse state in globals (CbcOrClpParam.cpp: the argv index
// CbcOrClpRead_mode, the static strings afterEquals / line, the FILE* it falls back to). Two
// CbcMain1 calls at once corrupt each other's argv index: one ran past its "-quit" into reading
// commands from stdin ("Coin:" prompt, a hang with stdin open), or a data race on a std::string.
extern FILE* CbcOrClpReadCommand;  // defined in libCbcSolver (a global, not in a namespace)

namespace weft::solver {

namespace {
// One CbcMain1 at a time in the process, and its command stream never stdin: an empty file, so a
// parse that ever reaches it reads end-of-input and stops instead of prompting.
std::mutex& cbc_driver_mutex() {
  static std::mutex m;
  return m;
}
void never_read_stdin() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (FILE* empty = std::fopen("/dev/null", "r")) CbcOrClpReadCommand = empty;
  });
}

constexpr double kInf = std::numeric_limits<double>::max();  // CBC treats DBL_MAX as infinity
bool finite(double v) { return std::isfinite(v); }
bool is_int(VarType t) { return t != VarType::Continuous; }
}  // namespace

std::string_view ilp_status_name(IlpStatus s) {
  switch (s) {
    case IlpStatus::Optimal: return "optimal";
    case IlpStatus::FeasibleAtGap: return "feasible_at_gap";
    case IlpStatus::Timeout: return "timeout";
    case IlpStatus::Infeasible: return "infeasible";
    case IlpStatus::Error: return "error";
  }
  return "?";
}

int Ilp::add_var(Variable v) {
  WEFT_CHECK(!std::isnan(v.lb) && !std::isnan(v.ub) && v.lb <= v.ub, "Ilp: variable '{}' has bounds [{}, {}]",
             v.name, v.lb, v.ub);
  WEFT_CHECK(finite(v.obj), "Ilp: variable '{}' has a non-finite objective coefficient {}", v.name, v.obj);
  if (v.name.empty()) v.name = "x" + std::to_string(vars_.size());
  vars_.push_back(std::move(v));
  return static_cast<int>(vars_.size()) - 1;
}

int Ilp::add_binary(double obj, std::string name) {
  return add_var({std::move(name), VarType::Binary, 0, 1, obj});
}
int Ilp::add_integer(double lb, double ub, double obj, std::string name) {
  return add_var({std::move(name), VarType::Integer, lb, ub, obj});
}
int Ilp::add_continuous(double lb, double ub, double obj, std::string name) {
  return add_var({std::move(name), VarType::Continuous, lb, ub, obj});
}

int Ilp::add_constraint(std::vector<Term> terms, Sense sense, double rhs, std::string name) {
  WEFT_CHECK(finite(rhs), "Ilp: constraint '{}' has a non-finite right-hand side", name);
  for (const Term& t : terms) {
    WEFT_CHECK(t.var >= 0 && t.var < num_variables(), "Ilp: constraint '{}' uses unknown variable {}", name,
               t.var);
    WEFT_CHECK(finite(t.coef), "Ilp: constraint '{}' has a non-finite coefficient", name);
  }
  if (name.empty()) name = "r" + std::to_string(cons_.size());
  cons_.push_back({std::move(name), std::move(terms), sense, rhs});
  return static_cast<int>(cons_.size()) - 1;
}

void Ilp::set_objective(int var, double coef) {
  WEFT_CHECK(var >= 0 && var < num_variables(), "Ilp: unknown variable {}", var);
  WEFT_CHECK(finite(coef), "Ilp: non-finite objective coefficient");
  vars_[var].obj = coef;
}

int Ilp::num_integer() const {
  return static_cast<int>(
      std::count_if(vars_.begin(), vars_.end(), [](const Variable& v) { return is_int(v.type); }));
}

double Ilp::evaluate(const std::vector<double>& x) const {
  WEFT_CHECK(x.size() == vars_.size(), "Ilp::evaluate: {} values for {} variables", x.size(), vars_.size());
  double s = offset_;
  for (std::size_t j = 0; j < x.size(); ++j) s += vars_[j].obj * x[j];
  return s;
}

std::vector<std::string> Ilp::violations(const std::vector<double>& x, double tol) const {
  WEFT_CHECK(x.size() == vars_.size(), "Ilp::violations: {} values for {} variables", x.size(), vars_.size());
  std::vector<std::string> out;
  for (std::size_t j = 0; j < x.size(); ++j) {
    const Variable& v = vars_[j];
    if (x[j] < v.lb - tol || x[j] > v.ub + tol)
      out.push_back(fmt::format("{} = {} outside [{}, {}]", v.name, x[j], v.lb, v.ub));
    if (is_int(v.type) && std::abs(x[j] - std::round(x[j])) > tol)
      out.push_back(fmt::format("{} = {} is not integral", v.name, x[j]));
  }
  for (const Constraint& c : cons_) {
    double lhs = 0;
    for (const Term& t : c.terms) lhs += t.coef * x[t.var];
    const double scale = std::max(1.0, std::abs(c.rhs));
    bool ok = c.sense == Sense::LessEqual      ? lhs <= c.rhs + tol * scale
              : c.sense == Sense::GreaterEqual ? lhs >= c.rhs - tol * scale
                                               : std::abs(lhs - c.rhs) <= tol * scale;
    if (!ok) {
      const char* op = c.sense == Sense::LessEqual ? "<=" : c.sense == Sense::GreaterEqual ? ">=" : "==";
      out.push_back(fmt::format("{}: {} {} {} violated", c.name, lhs, op, c.rhs));
    }
  }
  return out;
}

std::string Ilp::to_string() const {
  return fmt::format("Ilp({} vars ({} int), {} rows)", num_variables(), num_integer(), num_constraints());
}

std::string IlpResult::to_string() const {
  return fmt::format("IlpResult({}, objective={:.6g}, bound={:.6g}, gap={:.3g}, {:.3f}s)",
                     ilp_status_name(status), objective, bound, gap, wall_s);
}

namespace {

// What one solve shares with the event handlers CBC and CLP call back (CBC clones the handlers
// into every model and solver copy it makes, so the clones hold a pointer to this state, which
// outlives them all; the solve is single-threaded, so plain fields suffice).
struct StopState {
  StopToken token;                             // the caller's token with time_limit_s folded in
  StopToken::Clock::time_point hard_deadline;  // past it even CBC's clean-up LPs are stopped
  bool fired = false;      // a handler stopped an LP or the search (CBC's result is cut short)
  bool main_tree = false;  // the main branch and bound passed its first node (the root is solved)
  bool cleanup = false;    // the main search has ended: what follows is CBC's clean-up
};

// Checked by CLP after every simplex iteration and factorization: stops the LP it is in (the
// root relaxation of a large model can take seconds; CBC's own time limit never looks inside it).
class ClpStop : public ClpEventHandler {
 public:
  explicit ClpStop(StopState* s) : s_(s) {}
  ClpEventHandler* clone() const override { return new ClpStop(*this); }
  int event(Event e) override {
    if (e != endOfIteration && e != endOfFactorization) return -1;
    if (!s_->token.stop_requested()) return -1;
    if (s_->token.cancelled() || StopToken::Clock::now() >= s_->hard_deadline) {
      s_->fired = true;
      return 0;
    }
    // On a deadline, only the LPs of the root phase stop here (the root relaxation, its cut
    // passes, the MIP start's LP). In the tree CBC stops at the next node boundary instead: a node
    // LP stopped half-way would read as an infeasible node and corrupt the bound. After the main
    // search, the LPs that undo the preprocessing and complete the incumbent are short clean-up
    // that the incumbent needs.
    if (s_->main_tree || s_->cleanup) return -1;
    s_->fired = true;
    return 0;  // status 5: stopped by an event handler
  }

 private:
  StopState* s_;
};

// Checked by CBC at every node, tree report and heuristic pass: ends the branch and bound with its
// incumbent (never on a solution event: answering one with anything but noAction rejects it).
// The main search is the one without a parent model (heuristics run small branch and bounds of
// their own, with the same handler cloned in).
class CbcStop : public CbcEventHandler {
 public:
  explicit CbcStop(StopState* s) : s_(s) {}
  CbcEventHandler* clone() const override { return new CbcStop(*this); }
  CbcAction event(CbcEvent e) override {
    const bool main = getModel() != nullptr && getModel()->parentModel() == nullptr;
    if (main && (e == node || e == treeStatus)) s_->main_tree = true;
    if (main && e == endSearch) s_->cleanup = true;
    if (!s_->token.stop_requested()) return noAction;
    switch (e) {
      case node:
      case treeStatus:
        if (main) s_->cleanup = true;
        s_->fired = true;
        return stop;
      // A heuristic's own loop (feasibility pump passes, the small branch and bound of RINS and
      // friends) only listens to killSolution: it abandons the heuristic, not a solution found.
      case heuristicPass:
      case smallBranchAndBound:
        s_->fired = true;
        return killSolution;
      default: return noAction;
    }
  }
  CbcAction event(CbcEvent e, void*) override { return event(e); }

 private:
  StopState* s_;
};

int no_callback(CbcModel*, int) { return 0; }

// A lower bound on c·x from the variable bounds alone (no rows): the honest bound of a solve
// stopped before its LP relaxation was solved. -inf when a variable is unbounded the wrong way.
double box_bound(const Ilp& model) {
  double s = model.objective_offset();
  for (const Variable& v : model.variables()) {
    if (v.obj > 0) s += v.obj * v.lb;
    if (v.obj < 0) s += v.obj * v.ub;
  }
  return std::isnan(s) ? -std::numeric_limits<double>::infinity() : s;
}

// The caller's warm start when it is a feasible assignment (integer columns rounded), else empty:
// the incumbent of a solve stopped before CBC accepted its MIP start.
std::vector<double> feasible_warm_start(const Ilp& model, const IlpOptions& opt) {
  if (opt.warm_start.empty()) return {};
  std::vector<double> x = opt.warm_start;
  for (int j = 0; j < model.num_variables(); ++j)
    if (is_int(model.variables()[j].type)) x[j] = std::round(x[j]);
  if (!model.violations(x, 1e-5).empty()) return {};
  return x;
}

void set_gap(IlpResult& res) {
  res.bound = std::min(res.bound, res.objective);
  res.gap = std::isinf(res.bound)
                ? std::numeric_limits<double>::infinity()
                : std::max(0.0, (res.objective - res.bound) / std::max(std::abs(res.objective), 1e-12));
}

}  // namespace

IlpResult solve(const Ilp& model, const IlpOptions& opt) {
  WEFT_CHECK(opt.time_limit_s > 0 && finite(opt.time_limit_s), "solve: time_limit_s must be positive, got {}",
             opt.time_limit_s);
  WEFT_CHECK(opt.relative_gap >= 0 && finite(opt.relative_gap), "solve: relative_gap must be >= 0, got {}",
             opt.relative_gap);
  WEFT_CHECK(opt.warm_start.empty() || static_cast<int>(opt.warm_start.size()) == model.num_variables(),
             "solve: warm start has {} values for {} variables", opt.warm_start.size(),
             model.num_variables());
  opt.stop.throw_if_cancelled("the ILP solve");
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  IlpResult res;
  const int n = model.num_variables();
  if (n == 0) {
    // Nothing to decide: feasible iff every constraint holds at 0 terms.
    res.status = model.violations({}).empty() ? IlpStatus::Optimal : IlpStatus::Infeasible;
    if (res.status == IlpStatus::Optimal) res.objective = res.bound = model.objective_offset();
    res.wall_s = elapsed();
    return res;
  }
  // Declared before every CBC object: the handlers' clones point here until CBC deletes them.
  StopState st;
  st.token = opt.stop.within(opt.time_limit_s);
  const double budget = st.token.remaining_s();
  const std::chrono::duration<double> cap(std::min(budget, 1e9) * 1.25 + 0.25);
  st.hard_deadline = StopToken::Clock::now() + std::chrono::duration_cast<StopToken::Clock::duration>(cap);
  // The result of a solve stopped before CBC produced anything usable: the caller's warm start
  // when it is feasible, with the bound the variable bounds give.
  auto stopped_without_cbc = [&] {
    st.token.throw_if_cancelled("the ILP solve");
    res.status = IlpStatus::Timeout;
    res.values = feasible_warm_start(model, opt);
    if (res.has_solution()) {
      res.objective = model.evaluate(res.values);
      res.bound = box_bound(model);
      set_gap(res);
    }
    res.wall_s = elapsed();
    return res;
  };
  if (st.token.stop_requested()) return stopped_without_cbc();

  // Column-major matrix for loadProblem.
  std::vector<std::vector<std::pair<int, double>>> cols(n);
  const auto& cons = model.constraints();
  std::vector<double> rlo(cons.size()), rup(cons.size());
  for (std::size_t i = 0; i < cons.size(); ++i) {
    for (const Term& t : cons[i].terms) cols[t.var].push_back({static_cast<int>(i), t.coef});
    rlo[i] = cons[i].sense == Sense::LessEqual ? -kInf : cons[i].rhs;
    rup[i] = cons[i].sense == Sense::GreaterEqual ? kInf : cons[i].rhs;
  }
  std::vector<CoinBigIndex> start(n + 1, 0);
  std::vector<int> index;
  std::vector<double> value, clo(n), cup(n), obj(n);
  for (int j = 0; j < n; ++j) {
    start[j] = static_cast<CoinBigIndex>(index.size());
    for (auto [r, c] : cols[j]) {
      index.push_back(r);
      value.push_back(c);
    }
    const Variable& v = model.variables()[j];
    clo[j] = std::isinf(v.lb) ? -kInf : v.lb;
    cup[j] = std::isinf(v.ub) ? kInf : v.ub;
    obj[j] = v.obj;
  }
  start[n] = static_cast<CoinBigIndex>(index.size());

  OsiClpSolverInterface lp;
  lp.loadProblem(n, static_cast<int>(cons.size()), start.data(), index.empty() ? nullptr : index.data(),
                 value.empty() ? nullptr : value.data(), clo.data(), cup.data(), obj.data(),
                 cons.empty() ? nullptr : rlo.data(), cons.empty() ? nullptr : rup.data());
  std::vector<int> int_cols;
  for (int j = 0; j < n; ++j)
    if (is_int(model.variables()[j].type)) int_cols.push_back(j);
  if (!int_cols.empty()) lp.setInteger(int_cols.data(), static_cast<int>(int_cols.size()));
  const ClpStop clp_stop(&st);
  lp.getModelPtr()->passInEventHandler(&clp_stop);  // cloned into the solver (and its copies)
  lp.messageHandler()->setLogLevel(opt.log_level);
  lp.getModelPtr()->messageHandler()->setLogLevel(opt.log_level);
  // No CLP signal handler: ClpSimplex::initialSolve otherwise swaps SIGINT's process-wide handler
  // for its own for the length of every LP (a static `currentModel`, not thread-safe), so a
  // Ctrl-C meant for the caller (Python's KeyboardInterrupt, the CLI's exit 130) was eaten by
  // whichever LP happened to run, and two threads' save/restore could leave CLP's handler in
  // place for good. Special option 2 = 1 is CLP's "no interrupt handling"; CBC's clones copy it.
  ClpSolve no_interrupt;
  no_interrupt.setSpecialOption(2, 1);
  lp.setSolveOptions(no_interrupt);

  if (int_cols.empty()) {
    // A pure LP: CLP alone, as CBC's C interface does.
    lp.initialSolve();
    res.wall_s = elapsed();
    st.token.throw_if_cancelled("the ILP solve");
    if (st.fired && !lp.isProvenOptimal()) return stopped_without_cbc();
    if (lp.isProvenOptimal()) {
      res.values.assign(lp.getColSolution(), lp.getColSolution() + n);
      if (!model.violations(res.values, 1e-5).empty()) res.values.clear();
    }
    if (res.has_solution()) {
      res.objective = model.evaluate(res.values);
      res.bound = res.objective;
      res.status = IlpStatus::Optimal;
    } else {
      res.status = IlpStatus::Infeasible;  // infeasible or unbounded, as the C interface reported
    }
    return res;
  }

  // The branch and cut of CBC's stand-alone solver (CbcMain0/CbcMain1: presolve, integer
  // preprocessing, cuts and heuristics), the driver CBC's C interface runs, on a model whose
  // event handlers listen to the stop token.
  CbcModel cbc(lp);  // clones the solver, its CLP event handler included
  const CbcStop cbc_stop(&st);
  cbc.passInEventHandler(&cbc_stop);
  // (the driver's globals: see cbc_driver_mutex; the budget is what is left once it is ours)
  const std::lock_guard<std::mutex> driver(cbc_driver_mutex());
  never_read_stdin();
  if (st.token.stop_requested()) return stopped_without_cbc();
  CbcSolverUsefulData data;
  CbcMain0(cbc, data);
  data.noPrinting_ = opt.log_level == 0;
  data.useSignalHandler_ = false;  // Ctrl-C is the caller's (the token), never CBC's own handler
  cbc.setLogLevel(opt.log_level);
  cbc.messageHandler()->setLogLevel(opt.log_level);
  cbc.solver()->messageHandler()->setLogLevel(opt.log_level);
  // CBC's own limit as well: its heuristics and cut loops look at it between LPs.
  cbc.setMaximumSeconds(std::max(std::min(budget, st.token.remaining_s()), 1e-3));
  if (opt.relative_gap > 0) cbc.setAllowableFractionGap(opt.relative_gap);
  // MIP start: integer columns only (CBC fixes them and solves the LP for the rest; handing it
  // continuous values too makes CBC 2.10 report some feasible models infeasible).
  std::vector<std::pair<std::string, double>> mip_start;
  if (!opt.warm_start.empty()) {
    for (int j : int_cols) mip_start.push_back({cbc.solver()->getColName(j), std::round(opt.warm_start[j])});
    cbc.setMIPStart(mip_start);
  }
  std::vector<std::string> args{"weft",
                                "-log",
                                std::to_string(opt.log_level),
                                "-threads",
                                "0",
                                "-randomCbcSeed",
                                std::to_string(std::max(1, opt.seed)),
                                "-timeMode",
                                "elapsed"};
  // Presolve pays off on models with knapsack rows; on pure assignment models (one-hot rows
  // plus their linearisation) it finds little and can cost more than the solve.
  if (!opt.presolve) args.insert(args.end(), {"-presolve", "off"});
  if (!opt.preprocess) args.insert(args.end(), {"-preprocess", "off"});
  args.insert(args.end(), {"-solve", "-quit"});
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  CbcMain1(static_cast<int>(argv.size()), argv.data(), cbc, no_callback, data);
  res.wall_s = elapsed();
  st.token.throw_if_cancelled("the ILP solve");

  const double* sol = cbc.getColSolution();
  const double best = cbc.getObjValue();
  const bool have = sol != nullptr && std::isfinite(best) && std::abs(best) < 1e49;
  if (have) {
    res.values.assign(sol, sol + n);
    for (int j : int_cols) res.values[j] = std::round(res.values[j]);
    // A solution CBC reports must satisfy the model; treat anything else as no solution.
    if (!model.violations(res.values, 1e-5).empty()) res.values.clear();
  }
  if (st.fired) {
    // Stopped by the token's deadline: CBC's incumbent if it holds one that checks, else the
    // caller's warm start. The bound is CBC's once its tree search ran (each open node's LP
    // solved, as when CBC stops on its own limit); a search stopped in the root phase proves
    // only what the variable bounds give.
    if (!res.has_solution()) return stopped_without_cbc();
    res.status = IlpStatus::Timeout;
    res.objective = model.evaluate(res.values);
    const double raw_bound = cbc.getBestPossibleObjValue();
    res.bound = st.main_tree && std::isfinite(raw_bound) && std::abs(raw_bound) < 1e49
                    ? raw_bound + model.objective_offset()
                    : box_bound(model);
    set_gap(res);
    return res;
  }
  if (res.has_solution()) {
    res.objective = model.evaluate(res.values);
    const double raw_bound = cbc.getBestPossibleObjValue();
    res.bound = std::isfinite(raw_bound) && std::abs(raw_bound) < 1e49 ? raw_bound + model.objective_offset()
                                                                       : res.objective;
    set_gap(res);
  }
  // A checked incumbent wins over CBC's flags (with a MIP start, CBC 2.10 can flag the
  // fixed-integer LP of its start as "initial solve infeasible" and still hold a solution).
  if (!res.has_solution() && (cbc.isProvenInfeasible() || cbc.isInitialSolveProvenPrimalInfeasible())) {
    res.status = IlpStatus::Infeasible;
  } else if (cbc.isAbandoned() && !res.has_solution()) {
    res.status = IlpStatus::Error;
  } else if (cbc.isProvenOptimal() && res.has_solution()) {
    // CBC proved optimality within its own tolerances (the LP's are 1e-7): a bound that differs
    // from the incumbent by less than that relatively is numerical noise, not a gap.
    if (res.gap <= 1e-7 || res.objective - res.bound <= 1e-9) {
      res.status = IlpStatus::Optimal;
      res.bound = res.objective;
      res.gap = 0;
    } else {
      res.status = IlpStatus::FeasibleAtGap;
    }
  } else if (cbc.isSecondsLimitReached()) {
    res.status = IlpStatus::Timeout;
  } else if (res.has_solution()) {
    res.status = res.gap <= 1e-9 ? IlpStatus::Optimal : IlpStatus::FeasibleAtGap;
  } else if (st.token.expired() || elapsed() >= budget) {
    // CBC stopped on its own seconds limit in a phase that sets no flag (preprocessing, the
    // root's cut loop): nothing was proven, so this is a timeout, never "infeasible".
    return stopped_without_cbc();
  } else {
    res.status = IlpStatus::Infeasible;
  }
  return res;
}

}  // namespace weft::solver
