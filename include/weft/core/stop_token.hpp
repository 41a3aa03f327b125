#pragma once
// When a long search must stop: a wall-clock deadline and/or a cancellation flag that another
// thread raises (Python's Ctrl-C watcher, a notebook's stop button). A StopToken is a small value:
// copies share the flag, so the caller keeps one copy and hands the others down the searches.
// Every long loop asks stop_requested(); the ILP solver asks it from CBC's and CLP's callbacks.
//
// Two outcomes, two exceptions' meanings: an expired deadline is a normal result (searches return
// their best solution so far with its gap, or a weft::Error saying no solution was found within the
// limit); a cancellation is weft::Cancelled (Python: KeyboardInterrupt when the cancel came from a
// signal), never a partial result.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

namespace weft {

// The search was cancelled through its StopToken.
class Cancelled : public std::runtime_error {
 public:
  explicit Cancelled(const std::string& what = "cancelled") : std::runtime_error(what) {}
};

class StopToken {
 public:
  using Clock = std::chrono::steady_clock;

  StopToken() = default;  // never stops (no flag, no deadline)

  // A token with its own cancellation flag (cancel() on any copy stops them all).
  static StopToken cancellable() {
    StopToken t;
    t.flag_ = std::make_shared<std::atomic<bool>>(false);
    return t;
  }

  // This token with a deadline at most `seconds` from now (the earlier of the two; the flag is
  // shared). seconds = +inf keeps the current deadline; seconds <= 0 gives an expired token.
  StopToken within(double seconds) const {
    StopToken t = *this;
    if (std::isnan(seconds) || seconds == std::numeric_limits<double>::infinity()) return t;
    const double capped = std::min(seconds, 1e9);  // ~31 years: never overflows the clock
    const auto d = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(std::max(0.0, capped)));
    t.deadline_ = std::min(t.deadline_, d);
    return t;
  }

  void cancel() const {
    if (flag_) flag_->store(true, std::memory_order_relaxed);
  }
  bool cancelled() const { return flag_ && flag_->load(std::memory_order_relaxed); }
  bool has_deadline() const { return deadline_ != Clock::time_point::max(); }
  bool expired() const { return has_deadline() && Clock::now() >= deadline_; }
  bool stop_requested() const { return cancelled() || expired(); }
  // Seconds left before the deadline (+inf without one, 0 once passed).
  double remaining_s() const {
    if (!has_deadline()) return std::numeric_limits<double>::infinity();
    return std::max(0.0, std::chrono::duration<double>(deadline_ - Clock::now()).count());
  }
  // Throws Cancelled when the flag is raised (deadlines are the caller's business: a search that
  // runs out of time returns its best result so far).
  void throw_if_cancelled(const char* where = "the search") const {
    if (cancelled()) throw Cancelled(std::string(where) + " was cancelled");
  }

 private:
  std::shared_ptr<std::atomic<bool>> flag_;
  Clock::time_point deadline_ = Clock::time_point::max();
};

}  // namespace weft
