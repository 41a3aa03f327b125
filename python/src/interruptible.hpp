#pragma once
// Long C++ calls from Python (planning, SPMD searches) that do not hold the GIL and answer Ctrl-C.
//
// run_interruptible(work) runs work(cancelled) on a worker thread while the calling thread, GIL
// released, waits in 50 ms slices and checks Python's signals between them (PyErr_CheckSignals).
// On KeyboardInterrupt (or any exception a signal handler raises) it cancels the work's StopToken,
// detaches the worker and raises at once; the worker stops at its next check of the token (the
// planner's loops, the SPMD search, CBC's and CLP's callbacks) or its next progress report
// (cancellation_hook throws there), so the CPU is freed soon after. The worker owns copies of everything it reads.
// Python callbacks run on the worker thread with the GIL taken (python_callback).
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "weft/core/error.hpp"
#include "weft/core/stop_token.hpp"

namespace weft::python {

namespace py = pybind11;

// The work's cancellation: hand it to the C++ options' `stop` (PlanOptions, spmd::SearchOptions).
using CancelFlag = weft::StopToken;

// Thrown on the worker thread at a progress report after the caller was interrupted.
struct Cancelled : std::exception {
  const char* what() const noexcept override { return "cancelled (KeyboardInterrupt)"; }
};

// A Python callable the worker may call and drop without the GIL held: calls and the last release
// take the GIL.
inline std::shared_ptr<py::function> python_callback(py::function fn) {
  return std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function* f) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: leak rather than crash
    py::gil_scoped_acquire gil;
    delete f;
  });
}

// A progress hook that stops the work once the caller is interrupted, then forwards to `next`.
template <typename Report>
std::function<void(const Report&)> cancellation_hook(CancelFlag cancelled,
                                                     std::function<void(const Report&)> next) {
  return [cancelled = std::move(cancelled), next = std::move(next)](const Report& r) {
    if (cancelled.cancelled()) throw Cancelled();
    if (next) next(r);
  };
}

template <typename Work>
auto run_interruptible(Work work) -> decltype(work(CancelFlag{})) {
  using Result = decltype(work(CancelFlag{}));
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::optional<Result> result;
    std::exception_ptr error;
  };
  auto state = std::make_shared<State>();
  auto cancelled = weft::StopToken::cancellable();
  std::thread worker([state, cancelled, work = std::move(work)]() mutable {
    std::optional<Result> r;
    std::exception_ptr e;
    try {
      r.emplace(work(cancelled));
    } catch (...) {
      e = std::current_exception();
    }
    std::lock_guard lock(state->mu);
    state->result = std::move(r);
    state->error = e;
    state->done = true;
    state->cv.notify_all();
  });
  bool interrupted = false;
  {
    py::gil_scoped_release release;
    std::unique_lock lock(state->mu);
    while (!state->done && !interrupted) {
      state->cv.wait_for(lock, std::chrono::milliseconds(50));
      if (state->done) break;
      lock.unlock();
      {
        py::gil_scoped_acquire gil;
        interrupted = PyErr_CheckSignals() != 0;  // sets the Python error (KeyboardInterrupt)
      }
      lock.lock();
    }
    lock.unlock();
    // Joined without the GIL: the worker's last act, dropping its Python callbacks, takes it.
    if (!interrupted) worker.join();
  }
  if (interrupted) {  // the GIL is held again here, with the signal handler's error set
    cancelled.cancel();
    worker.detach();
    throw py::error_already_set();
  }
  if (state->error) std::rethrow_exception(state->error);
  return std::move(*state->result);
}

}  // namespace weft::python
