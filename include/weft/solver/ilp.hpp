#pragma once
// A small mixed-integer linear programming facade over COIN-OR CBC (through its library C++ API,
// never a subprocess), shared by every searcher in weft (SPMD, pipeline, resharding).
//
//   minimise    c·x + offset
//   subject to  Σ_j a_ij x_j  (<=, >=, ==)  b_i      for every constraint i
//               lb_j <= x_j <= ub_j,  x_j integer for integer/binary variables
//
// The model is a plain value (variables, constraints, objective); solve() is a pure function of
// the model and the options. evaluate()/violations() recompute objective and feasibility of any
// assignment independently of CBC, for tests and reports.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/core/stop_token.hpp"

namespace weft::solver {

enum class VarType : std::uint8_t { Binary, Integer, Continuous };
enum class Sense : std::uint8_t { LessEqual, GreaterEqual, Equal };

struct Variable {
  std::string name;
  VarType type = VarType::Binary;
  double lb = 0, ub = 1;
  double obj = 0;
  bool operator==(const Variable&) const = default;
};

struct Term {
  int var = 0;
  double coef = 0;
  bool operator==(const Term&) const = default;
};

struct Constraint {
  std::string name;
  std::vector<Term> terms;
  Sense sense = Sense::LessEqual;
  double rhs = 0;
  bool operator==(const Constraint&) const = default;
};

class Ilp {
 public:
  // Each returns the variable's index. Throws weft::Error on lb > ub or non-finite numbers.
  int add_binary(double obj = 0, std::string name = {});
  int add_integer(double lb, double ub, double obj = 0, std::string name = {});
  int add_continuous(double lb, double ub, double obj = 0, std::string name = {});
  // Throws weft::Error on an unknown variable index or a non-finite coefficient.
  int add_constraint(std::vector<Term> terms, Sense sense, double rhs, std::string name = {});
  void set_objective(int var, double coef);
  void add_objective_offset(double c) { offset_ += c; }

  int num_variables() const { return static_cast<int>(vars_.size()); }
  int num_constraints() const { return static_cast<int>(cons_.size()); }
  int num_integer() const;
  const std::vector<Variable>& variables() const { return vars_; }
  const std::vector<Constraint>& constraints() const { return cons_; }
  double objective_offset() const { return offset_; }

  // Objective of an assignment (size num_variables()).
  double evaluate(const std::vector<double>& x) const;
  // Human-readable list of violated bounds, integrality and constraints (empty = feasible).
  std::vector<std::string> violations(const std::vector<double>& x, double tol = 1e-6) const;
  std::string to_string() const;  // "Ilp(12 vars (10 int), 5 rows)"

 private:
  int add_var(Variable v);
  std::vector<Variable> vars_;
  std::vector<Constraint> cons_;
  double offset_ = 0;
};

enum class IlpStatus : std::uint8_t {
  Optimal,        // proven optimal (gap <= 1e-9 relative)
  FeasibleAtGap,  // stopped because the requested relative gap was reached
  Timeout,        // time limit / deadline hit; has_solution() says whether an incumbent exists
  Infeasible,     // proven infeasible
  Error,          // CBC abandoned (numerical trouble); no usable result
};
std::string_view ilp_status_name(IlpStatus s);

struct IlpOptions {
  double time_limit_s = 60;        // wall-clock seconds from the call, the root LP included
  double relative_gap = 0;         // stop when (incumbent - bound) / |incumbent| <= this
  std::vector<double> warm_start;  // optional full assignment handed to CBC as a MIP start
  int seed = 1;                    // CBC random seed (runs are single-threaded and deterministic)
  int log_level = 0;               // CBC's log level; 0 = silent
  bool presolve = true;            // CBC's presolve (off can be faster on pure assignment models)
  bool preprocess = true;          // CBC's integer preprocessing (CglPreProcess; same remark)
  // The caller's deadline and cancellation (Ctrl-C): honoured with time_limit_s, whichever comes
  // first, from inside CBC (a CLP event handler after every simplex iteration of the root phase,
  // a CBC event handler at every node). A deadline gives IlpStatus::Timeout with CBC's incumbent,
  // else the warm start when it is feasible (else no solution); a deadline already passed returns
  // so at once. A cancel throws weft::Cancelled.
  StopToken stop;
};

struct IlpResult {
  IlpStatus status = IlpStatus::Error;
  std::vector<double> values;  // best assignment found (empty when none)
  double objective = 0;        // objective of `values` (offset included)
  double bound = 0;            // best proven lower bound (offset included)
  double gap = 0;              // (objective - bound) / max(|objective|, 1e-12); 0 when optimal
  double wall_s = 0;
  bool has_solution() const { return !values.empty(); }
  std::string to_string() const;
};

// Throws weft::Error on bad options (negative time limit or gap, warm start of the wrong size).
// An empty model (no variables) is solved trivially.
IlpResult solve(const Ilp& model, const IlpOptions& options = {});

}  // namespace weft::solver
