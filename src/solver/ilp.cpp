// ILP facade over COIN-OR CBC's C API.
//
//   minimise c·x + offset  s.t.  A x (<=,>=,==) b,  lb <= x <= ub,  x_j ∈ Z for integer columns.
//
// The model is loaded column by column into a fresh Cbc_Model per solve (no state survives a
// call), CBC runs single-threaded with a fixed seed and wall-clock time limit, and the answer is
// re-scored with Ilp::evaluate so the reported objective never depends on CBC's rounding.
#include "weft/solver/ilp.hpp"

#include <Cbc_C_Interface.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "weft/core/error.hpp"

namespace weft::solver {

namespace {
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
struct CbcDeleter {
  void operator()(Cbc_Model* m) const { Cbc_deleteModel(m); }
};
}  // namespace

IlpResult solve(const Ilp& model, const IlpOptions& opt) {
  WEFT_CHECK(opt.time_limit_s > 0 && finite(opt.time_limit_s), "solve: time_limit_s must be positive, got {}",
             opt.time_limit_s);
  WEFT_CHECK(opt.relative_gap >= 0 && finite(opt.relative_gap), "solve: relative_gap must be >= 0, got {}",
             opt.relative_gap);
  WEFT_CHECK(opt.warm_start.empty() || static_cast<int>(opt.warm_start.size()) == model.num_variables(),
             "solve: warm start has {} values for {} variables", opt.warm_start.size(),
             model.num_variables());
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

  // Column-major matrix for Cbc_loadProblem.
  std::vector<std::vector<std::pair<int, double>>> cols(n);
  const auto& cons = model.constraints();
  std::vector<double> rlo(cons.size()), rup(cons.size());
  for (std::size_t i = 0; i < cons.size(); ++i) {
    for (const Term& t : cons[i].terms) cols[t.var].push_back({static_cast<int>(i), t.coef});
    const double inf = kInf;
    rlo[i] = cons[i].sense == Sense::LessEqual ? -inf : cons[i].rhs;
    rup[i] = cons[i].sense == Sense::GreaterEqual ? inf : cons[i].rhs;
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

  std::unique_ptr<Cbc_Model, CbcDeleter> m(Cbc_newModel());
  Cbc_loadProblem(m.get(), n, static_cast<int>(cons.size()), start.data(),
                  index.empty() ? nullptr : index.data(), value.empty() ? nullptr : value.data(), clo.data(),
                  cup.data(), obj.data(), cons.empty() ? nullptr : rlo.data(),
                  cons.empty() ? nullptr : rup.data());
  for (int j = 0; j < n; ++j)
    if (is_int(model.variables()[j].type)) Cbc_setInteger(m.get(), j);
  Cbc_setLogLevel(m.get(), opt.log_level);
  Cbc_setParameter(m.get(), "threads", "0");
  Cbc_setParameter(m.get(), "randomCbcSeed", std::to_string(std::max(1, opt.seed)).c_str());
  Cbc_setParameter(m.get(), "timeMode", "elapsed");
  Cbc_setMaximumSeconds(m.get(), opt.time_limit_s);
  // Presolve pays off on models with knapsack rows; on pure assignment models (one-hot rows
  // plus their linearisation) it finds little and can cost more than the solve.
  if (!opt.presolve) Cbc_setParameter(m.get(), "presolve", "off");
  if (!opt.preprocess) Cbc_setParameter(m.get(), "preprocess", "off");
  if (opt.relative_gap > 0) Cbc_setAllowableFractionGap(m.get(), opt.relative_gap);
  // MIP start: integer columns only (CBC fixes them and solves the LP for the rest; handing it
  // continuous values too makes CBC 2.10 report some feasible models infeasible).
  std::vector<int> ws_idx;
  std::vector<double> ws_val;
  if (!opt.warm_start.empty()) {
    for (int j = 0; j < n; ++j)
      if (is_int(model.variables()[j].type)) {
        ws_idx.push_back(j);
        ws_val.push_back(std::round(opt.warm_start[j]));
      }
    if (!ws_idx.empty())
      Cbc_setMIPStartI(m.get(), static_cast<int>(ws_idx.size()), ws_idx.data(), ws_val.data());
  }
  Cbc_solve(m.get());
  res.wall_s = elapsed();

  const double* sol = Cbc_getColSolution(m.get());
  const double best = Cbc_getObjValue(m.get());
  const bool have = sol != nullptr && std::isfinite(best) && std::abs(best) < 1e49;
  if (have) {
    res.values.assign(sol, sol + n);
    for (int j = 0; j < n; ++j)
      if (is_int(model.variables()[j].type)) res.values[j] = std::round(res.values[j]);
    // A solution CBC reports must satisfy the model; treat anything else as no solution.
    if (!model.violations(res.values, 1e-5).empty()) res.values.clear();
  }
  if (res.has_solution()) {
    res.objective = model.evaluate(res.values);
    const double raw_bound = Cbc_getBestPossibleObjValue(m.get());
    res.bound = std::isfinite(raw_bound) && std::abs(raw_bound) < 1e49 ? raw_bound + model.objective_offset()
                                                                       : res.objective;
    res.bound = std::min(res.bound, res.objective);
    res.gap = std::max(0.0, (res.objective - res.bound) / std::max(std::abs(res.objective), 1e-12));
  }
  // A checked incumbent wins over CBC's flags (with a MIP start, CBC 2.10 can flag the
  // fixed-integer LP of its start as "initial solve infeasible" and still hold a solution).
  if (!res.has_solution() &&
      (Cbc_isProvenInfeasible(m.get()) || Cbc_isInitialSolveProvenPrimalInfeasible(m.get()))) {
    res.status = IlpStatus::Infeasible;
  } else if (Cbc_isAbandoned(m.get()) && !res.has_solution()) {
    res.status = IlpStatus::Error;
  } else if (Cbc_isProvenOptimal(m.get()) && res.has_solution()) {
    // CBC proved optimality within its own tolerances (the LP's are 1e-7): a bound that differs
    // from the incumbent by less than that relatively is numerical noise, not a gap.
    if (res.gap <= 1e-7 || res.objective - res.bound <= 1e-9) {
      res.status = IlpStatus::Optimal;
      res.bound = res.objective;
      res.gap = 0;
    } else {
      res.status = IlpStatus::FeasibleAtGap;
    }
  } else if (Cbc_isSecondsLimitReached(m.get())) {
    res.status = IlpStatus::Timeout;
  } else if (res.has_solution()) {
    res.status = res.gap <= 1e-9 ? IlpStatus::Optimal : IlpStatus::FeasibleAtGap;
  } else {
    res.status = IlpStatus::Infeasible;
  }
  return res;
}

}  // namespace weft::solver
