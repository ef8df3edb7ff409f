// OwnLoop: the runtime side of edl.torch's own-loop API (edl.torch.Elastic; docs/PYTORCH.md,
// "Your own loop"). The user's Python loop keeps the model, the batches, the loss, the optimizer
// code; the C++ runtime (ElasticTrainer) keeps the data plan, the gradient all-reduce, the commit,
// the re-forms and the checkpoints. The two meet here.
//
// ElasticTrainer::Run runs on a thread of its own (the runtime thread) over this Trainable, whose
// compute methods hand the step over to Python instead of computing: each publishes a request and
// waits for Python's answer.
//
//   BeginStep + ForwardBackward   request "train": this rank's indices of the step (or, from
//    (or EmptyStep)               EmptyStep, another rank's as a stand-in) and the step's plan;
//                                 answered by job.step once the user's backward is done and the
//                                 gradients are in the flat buffer (with the loss and sample count)
//   ApplyUpdate(lr)               request "update": the gradients are all-reduced; answered when
//                                 the loop asks for its next batch, so everything the loop does
//                                 after job.step belongs to the step the runtime then commits
//   Evaluate / WarmUpStep         requests "evaluate" / "warm_up", answered by the user's
//                                 functions, if any
//   the end of Run                request "done": the status and the result; the thread ends
//
// So the runtime thread runs (all-reduces, commits, re-forms, checkpoints, hashes the state) only
// while Python waits in Wait(), and Python runs the user's code only while the runtime waits for
// an answer: the registered memory is never touched by both at once. The runtime thread never
// takes the GIL; Wait() releases it while it blocks, and wakes every 100 ms to let Python handle
// signals (Ctrl-C raises KeyboardInterrupt there).
//
// Abort(why) makes the pending and every later wait of the runtime thread return Aborted(why), so
// Run ends (a Python exception in the user's loop, interpreter exit); Join() waits for the thread.
//
// Thread-safety: the Python-side methods (Start, Wait, Answer, Abort, Join, counters, last_step)
// are called from Python with the GIL held, by one thread at a time; the Trainable methods from the
// runtime thread; the two meet only under mu_.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "edl/base/thread_annotations.h"
#include "python/src/host_trainable.h"
#include "python/src/run_job.h"

namespace edl::python {

class OwnLoop : public HostTrainable, public runtime::TrainingObserver, public SaveRequests {
 public:
  OwnLoop() = default;
  ~OwnLoop() override;  // aborts and joins a runtime thread still running (GIL held)
  OwnLoop(const OwnLoop&) = delete;
  OwnLoop& operator=(const OwnLoop&) = delete;

  // ---- Python (GIL held on entry)
  // Plans the run (a warm spare waits here for its identity) and starts the runtime thread. Throws
  // RuntimeError when called twice.
  void Start(const RunOptions& options);
  // The next request as a dict (see the header comment; "kind" is "train", "update", "evaluate",
  // "warm_up" or "done"), blocking with the GIL released until there is one. Raises what a signal
  // handler raises while it waits.
  py::dict Wait();
  // Answers request `seq`: train/evaluate with (loss_sum, correct, samples, label_hash); update
  // with `save` (rank 0 checkpoints right after this commit); warm_up with nothing.
  void Answer(int64_t seq, double loss_sum, int64_t correct, int64_t samples, uint64_t label_hash,
              bool save);
  void Abort(const std::string& why);
  // Waits for the runtime thread to end (GIL released); false if `timeout_s` passed first.
  bool Join(double timeout_s);
  // Writes of the runtime into the registered state (a state sync, a checkpoint load, a warm-up's
  // restore): when it moved, Python reloads what it keeps outside the registered memory.
  int64_t state_writes() const { return state_writes_.load(); }
  // The last committed step as the whole generation saw it (StepReport), None before the first;
  // the last evaluation (EvalReport), None before the first.
  py::object last_step();
  py::object last_eval();

  // ---- runtime::Trainable and the observer (the runtime thread)
  void BeginStep(const StepPlan& plan) override { plan_ = plan; }
  Status ForwardBackward(const std::vector<int64_t>& indices, runtime::StepStats* stats) override;
  Status EmptyStep(const std::vector<int64_t>& stand_in) override;
  Status WarmUpStep(const std::vector<int64_t>& indices) override;
  Status ApplyUpdate(double lr) override;
  Status Evaluate(const std::vector<int64_t>& indices, runtime::StepStats* stats) override;
  Status CopyFromHost(const runtime::StateTensor& t, const void* src) override;
  void OnStep(const runtime::StepReport& report) override;
  void OnEval(const runtime::EvalReport& report) override;
  bool TakeSaveRequest() override;

 private:
  enum class Kind { kNone, kTrain, kUpdate, kEvaluate, kWarmUp, kDone };
  struct Request {
    int64_t seq = 0;
    Kind kind = Kind::kNone;
    StepPlan plan;                  // train
    std::vector<int64_t> indices;   // train, evaluate, warm_up
    bool stand_in = false;          // train: `indices` are another rank's, for EmptyStep
    double lr = 0;                  // update
    Status status;                  // done
    runtime::ElasticResult result;  // done
  };
  struct Reply {
    runtime::StepStats stats;
    bool save = false;
  };
  // Runtime thread: publishes `r` and waits for its answer (Aborted after Abort()).
  Status Publish(Request r, Reply* reply) EXCLUDES(mu_);
  void RunThread(RunOptions options);

  Mutex mu_;
  std::condition_variable cv_;
  Request request_ GUARDED_BY(mu_);    // the newest request
  int64_t taken_ GUARDED_BY(mu_) = 0;  // the newest request Wait() returned
  int64_t answered_ GUARDED_BY(mu_) = 0;
  Reply reply_ GUARDED_BY(mu_);
  bool aborted_ GUARDED_BY(mu_) = false;
  std::string abort_why_ GUARDED_BY(mu_);
  bool finished_ GUARDED_BY(mu_) = false;  // the runtime thread published "done"
  bool has_step_ GUARDED_BY(mu_) = false;
  runtime::StepReport last_step_ GUARDED_BY(mu_);
  bool has_eval_ GUARDED_BY(mu_) = false;
  runtime::EvalReport last_eval_ GUARDED_BY(mu_);
  std::atomic<int64_t> state_writes_{0};
  std::thread thread_;  // Python side only
  // Runtime thread only.
  StepPlan plan_;
  bool save_this_commit_ = false;
};

}  // namespace edl::python
