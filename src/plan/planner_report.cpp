// The planner's text: a plan's layout on one line (layout_text), the alternatives it compared
// (alternative_of; sort_alternatives: best first, each layout once, the candidates that do not
// fit summarised) and the search space of a homogeneous make_plan (search_space_text).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "planner_detail.hpp"

namespace weft::plan::detail {

std::string mesh_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("({})", fmt::join(shape, ","));
}

std::string layout_text(const Plan& p) {
  std::string s = fmt::format("M={} dp={} {} stage{}:", p.num_microbatches, p.data_parallel, p.num_stages(),
                              p.num_stages() == 1 ? "" : "s");
  for (const auto& st : p.stages)
    s += fmt::format(" [{}-{}]@{}", st.first_block, st.last_block, mesh_text(st.mesh_shape));
  return s;
}

Alternative alternative_of(const Built& b) {
  Alternative a;
  a.strategy = b.plan.strategy;
  a.layout = b.plan.stages.empty() ? "" : layout_text(b.plan);
  a.feasible = b.feasible;
  a.step_time = b.feasible ? b.plan.step_time : 0;
  a.peak_memory = b.plan.peak_memory;
  a.note = b.note;
  return a;
}

void sort_alternatives(std::vector<Alternative>& alts, int max_n, bool summarise_infeasible) {
  std::stable_sort(alts.begin(), alts.end(), [](const Alternative& x, const Alternative& y) {
    if (x.feasible != y.feasible) return x.feasible;
    return x.step_time < y.step_time;
  });
  // The DP and the equal-block enumeration can reach the same layout: list it once.
  std::set<std::tuple<std::string, double, bool>> seen;
  std::erase_if(alts, [&](const Alternative& a) {
    const bool baseline = a.strategy.find("(baseline)") != std::string::npos;
    return a.feasible && !a.layout.empty() && !seen.insert({a.layout, a.step_time, baseline}).second;
  });
  if (summarise_infeasible) {
    // The candidates that do not fit, as one last row: how many, per reason (the note with its
    // numbers blanked, one example each).
    std::map<std::string, std::pair<int, std::string>> reasons;
    int n = 0;
    std::erase_if(alts, [&](const Alternative& a) {
      if (a.feasible) return false;
      std::string key;
      for (char ch : a.note) {
        const bool digit = std::isdigit(static_cast<unsigned char>(ch)) || ch == '.';
        if (!digit || key.empty() || key.back() != '#') key += digit ? '#' : ch;
      }
      auto& r = reasons[key];
      if (r.first++ == 0) r.second = a.strategy + " " + a.layout + ": " + a.note;
      ++n;
      return true;
    });
    if (max_n > 0 && static_cast<int>(alts.size()) >= max_n)
      alts.resize(static_cast<std::size_t>(std::max(0, max_n - (n > 0))));
    if (n > 0) {
      Alternative row;
      row.strategy = "infeasible";
      row.layout = fmt::format("{} candidate{}", n, n == 1 ? "" : "s");
      row.feasible = false;
      std::vector<std::pair<int, std::string>> by_count;
      for (auto& [key, r] : reasons) by_count.push_back(r);
      std::stable_sort(by_count.begin(), by_count.end(),
                       [](const auto& x, const auto& y) { return x.first > y.first; });
      for (const auto& [k, example] : by_count)
        row.note += fmt::format("{}{} x (e.g. {})", row.note.empty() ? "" : "; ", k, example);
      alts.push_back(std::move(row));
    }
    return;
  }
  if (max_n > 0 && static_cast<int>(alts.size()) > max_n) alts.resize(static_cast<std::size_t>(max_n));
}

// Why micro-batch sizes were left out: the graph could not be cut to them (rebatch_note), so the
// plan keeps larger micro-batches, or the whole batch (M = d = 1).
std::pair<std::vector<std::int64_t>, std::string> batch_sizes_left_out(const Context& ctx) {
  std::pair<std::vector<std::int64_t>, std::string> out;
  for (const auto& [bs, note] : ctx.rebatch_notes)
    if (!note.empty()) {
      out.first.push_back(bs);
      out.second = note;
    }
  return out;
}

std::string kept_batch_text(const Context& ctx) {
  const auto [sizes, why] = batch_sizes_left_out(ctx);
  if (sizes.empty()) return {};
  return fmt::format("; micro-batches of {} samples left out (the batch {} cannot be split that way): {}",
                     fmt::join(sizes, ", "), ctx.global_batch, why);
}

// The search space of a homogeneous make_plan, rule by rule, for Plan::search_space.
std::string search_space_text(const Context& ctx, const std::vector<SubmeshOptions>& subs,
                              const std::vector<int>& Ms, std::size_t configs, int pruned, int bounded) {
  const auto& o = ctx.opt_;
  std::size_t meshes = 0;
  for (const auto& s : subs) meshes += s.meshes.size();
  std::string ms = Ms.size() <= 4
                       ? fmt::format("{}", fmt::join(Ms, ","))
                       : fmt::format("{},{},...,{} ({} counts)", Ms[0], Ms[1], Ms.back(), Ms.size());
  const std::string ms_rule =
      o.num_microbatches > 0
          ? std::string("given")
          : fmt::format("auto: powers of two dividing the batch{}{}",
                        o.schedule == "interleaved" ? " (or the next divisor above a power of two)" : "",
                        o.max_microbatches > 0 ? fmt::format(", <= {}", o.max_microbatches) : std::string());
  const int nodes = static_cast<int>(ctx.c_.nodes().size());
  const std::string node_rule = o.whole_nodes_only ? "whole nodes" : "node slices and whole nodes";
  const std::string count_rule =
      o.power_of_two_nodes ? ", power-of-two nodes"
      : (!o.all_node_counts && nodes > kAllNodeCountsUpTo)
          ? fmt::format(", node counts that are powers of two or divide {} (auto)", nodes)
          : "";
  return fmt::format(
             "{} blocks ({}); micro-batches {} ({}); {} (micro-batches, replicas) pairs in the order of a "
             "lower bound, {} of them skipped (bound >= the best step found), {} left out by the memory "
             "bound (state + one micro-batch of activations over a replica's devices); {} submeshes / {} "
             "logical meshes ({}{}{}{}); stages <= {}; replicas {}; {} candidates simulated at most; "
             "schedule {}; Megatron baseline {}; {} thread(s)",
             ctx.L(), o.num_blocks > 0 ? "given" : "auto: min(forward ops, 16)", ms, ms_rule, configs,
             bounded, pruned, subs.size(), meshes, node_rule, count_rule,
             o.two_d_meshes ? ", 2-D meshes" : ", 1-D meshes",
             o.max_logical_shapes > 0 ? fmt::format(", <= {} shapes per submesh", o.max_logical_shapes) : "",
             o.pipeline ? (o.max_stages > 0 ? std::to_string(o.max_stages) : std::string("blocks"))
                        : std::string("1"),
             o.max_data_parallel > 0 ? fmt::format("<= {}", o.max_data_parallel) : std::string("any"),
             o.max_simulated, o.schedule, o.compare_megatron ? "on" : "off", ctx.num_threads()) +
         kept_batch_text(ctx);
}

}  // namespace weft::plan::detail
