#include "python/src/own_loop.h"
#include "python/src/report_dicts.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <utility>

namespace edl::python {
namespace {

py::array_t<int64_t> ToArray(const std::vector<int64_t>& v) {
  return py::array_t<int64_t>(static_cast<py::ssize_t>(v.size()), v.data());
}

constexpr std::chrono::milliseconds kSignalCheck{100};

}  // namespace

OwnLoop::~OwnLoop() {
  if (!thread_.joinable()) return;
  Abort("the job object was destroyed while the runtime was still running");
  if (PyGILState_Check() != 0) {
    py::gil_scoped_release release;
    thread_.join();
  } else {
    thread_.join();
  }
}

void OwnLoop::Start(const RunOptions& options) {
  if (thread_.joinable()) throw std::runtime_error("the runtime of this job was started already");
  // A warm spare waits here for its identity, with the GIL (it has nothing else to do); an error
  // is RunJob's to report.
  (void)PlanAndSyncEnviron();
  thread_ = std::thread([this, options] { RunThread(options); });
}

void OwnLoop::RunThread(RunOptions options) {
  Request done;
  done.kind = Kind::kDone;
  done.status = RunJob(this, options, this, this, &done.result);
  MutexLock lock(&mu_);
  done.seq = request_.seq + 1;
  request_ = std::move(done);
  finished_ = true;
  cv_.notify_all();
}

Status OwnLoop::Publish(Request r, Reply* reply) {
  MutexLock lock(&mu_);
  if (aborted_) return Status::Aborted(abort_why_);
  const int64_t seq = request_.seq + 1;
  r.seq = seq;
  request_ = std::move(r);
  cv_.notify_all();
  cv_.wait(lock.native(), [&]() REQUIRES(mu_) { return aborted_ || answered_ >= seq; });
  if (answered_ < seq) return Status::Aborted(abort_why_);
  *reply = reply_;
  return Status::OK();
}

py::dict OwnLoop::Wait() {
  Request r;
  for (;;) {
    bool got = false;
    {
      py::gil_scoped_release release;
      MutexLock lock(&mu_);
      got = cv_.wait_for(lock.native(), kSignalCheck,
                         [&]() REQUIRES(mu_) { return request_.seq > taken_; });
      if (got) {
        taken_ = request_.seq;
        r = request_;
      }
    }
    if (got) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  py::dict d;
  d["seq"] = r.seq;
  switch (r.kind) {
    case Kind::kTrain:
      d["kind"] = "train";
      d["step"] = r.plan.step;
      d["epoch"] = r.plan.position.epoch;
      d["cursor"] = r.plan.position.cursor;
      d["batches"] = r.plan.batch_sizes;
      d["rank"] = r.plan.rank;
      d["world_size"] = r.plan.world_size;
      d["generation"] = r.plan.generation;
      d["indices"] = ToArray(r.indices);
      d["stand_in"] = r.stand_in;
      break;
    case Kind::kUpdate:
      d["kind"] = "update";
      d["lr"] = r.lr;
      break;
    case Kind::kEvaluate:
    case Kind::kWarmUp:
      d["kind"] = r.kind == Kind::kEvaluate ? "evaluate" : "warm_up";
      d["indices"] = ToArray(r.indices);
      break;
    case Kind::kDone:
      d["kind"] = "done";
      d["ok"] = r.status.ok();
      d["error"] = r.status.ok() ? std::string() : r.status.ToString();
      d["left"] = r.result.left;
      d["step"] = r.result.step;
      d["generation"] = r.result.generation;
      d["last_loss"] = r.result.last_loss;
      d["accuracy"] = r.result.accuracy;
      d["state_hash"] = std::to_string(r.result.state_hash);
      break;
    case Kind::kNone:
      throw std::logic_error("OwnLoop: a request of no kind");
  }
  return d;
}

void OwnLoop::Answer(int64_t seq, double loss_sum, int64_t correct, int64_t samples,
                     uint64_t label_hash, bool save) {
  MutexLock lock(&mu_);
  if (seq != request_.seq || seq != taken_ || answered_ >= seq || request_.kind == Kind::kDone) {
    throw std::logic_error("OwnLoop: answer to request " + std::to_string(seq) +
                           ", which is not the one waiting (" + std::to_string(request_.seq) + ")");
  }
  reply_ = Reply();
  reply_.stats.loss_sum = loss_sum;
  reply_.stats.correct = correct;
  reply_.stats.samples = samples;
  reply_.stats.label_hash = label_hash;
  reply_.save = save;
  answered_ = seq;
  cv_.notify_all();
}

void OwnLoop::Abort(const std::string& why) {
  MutexLock lock(&mu_);
  if (aborted_) return;
  aborted_ = true;
  abort_why_ = why;
  cv_.notify_all();
}

bool OwnLoop::Join(double timeout_s) {
  if (!thread_.joinable()) return true;
  {
    py::gil_scoped_release release;
    MutexLock lock(&mu_);
    const auto limit = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    if (!cv_.wait_for(lock.native(), limit, [&]() REQUIRES(mu_) { return finished_; })) {
      return false;
    }
  }
  py::gil_scoped_release release;
  thread_.join();  // it published "done": nothing is left for it to do
  return true;
}

py::object OwnLoop::last_step() {
  runtime::StepReport r;
  {
    MutexLock lock(&mu_);
    if (!has_step_) return py::none();
    r = last_step_;
  }
  return StepDict(r);
}

py::object OwnLoop::last_eval() {
  runtime::EvalReport r;
  {
    MutexLock lock(&mu_);
    if (!has_eval_) return py::none();
    r = last_eval_;
  }
  return EvalDict(r);
}

// ---- the runtime thread

Status OwnLoop::ForwardBackward(const std::vector<int64_t>& indices, runtime::StepStats* stats) {
  Request r;
  r.kind = Kind::kTrain;
  r.plan = plan_;
  r.indices = indices;
  Reply reply;
  EDL_RETURN_IF_ERROR(Publish(std::move(r), &reply));
  *stats = reply.stats;
  return Status::OK();
}

Status OwnLoop::EmptyStep(const std::vector<int64_t>& stand_in) {
  Request r;
  r.kind = Kind::kTrain;
  r.plan = plan_;
  r.indices = stand_in;
  r.stand_in = true;
  Reply reply;
  EDL_RETURN_IF_ERROR(Publish(std::move(r), &reply));
  return ZeroGradients();  // whatever the loop computed on the stand-in counts for nothing
}

Status OwnLoop::WarmUpStep(const std::vector<int64_t>& indices) {
  Request r;
  r.kind = Kind::kWarmUp;
  r.indices = indices;
  Reply reply;
  return Publish(std::move(r), &reply);
}

Status OwnLoop::ApplyUpdate(double lr) {
  Request r;
  r.kind = Kind::kUpdate;
  r.lr = lr;
  Reply reply;
  EDL_RETURN_IF_ERROR(Publish(std::move(r), &reply));
  save_this_commit_ = reply.save;
  return Status::OK();
}

Status OwnLoop::Evaluate(const std::vector<int64_t>& indices, runtime::StepStats* stats) {
  Request r;
  r.kind = Kind::kEvaluate;
  r.indices = indices;
  Reply reply;
  EDL_RETURN_IF_ERROR(Publish(std::move(r), &reply));
  *stats = reply.stats;
  return Status::OK();
}

Status OwnLoop::CopyFromHost(const runtime::StateTensor& t, const void* src) {
  if (t.name.rfind("gradients", 0) != 0) state_writes_.fetch_add(1);
  return HostTrainable::CopyFromHost(t, src);
}

void OwnLoop::OnStep(const runtime::StepReport& report) {
  MutexLock lock(&mu_);
  last_step_ = report;
  has_step_ = true;
}

void OwnLoop::OnEval(const runtime::EvalReport& report) {
  MutexLock lock(&mu_);
  last_eval_ = report;
  has_eval_ = true;
}

bool OwnLoop::TakeSaveRequest() {
  const bool save = save_this_commit_;
  save_this_commit_ = false;
  return save;
}

}  // namespace edl::python
