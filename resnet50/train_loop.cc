#include "resnet50/train_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "edl/runtime/comm/memory_kv_store.h"

namespace edl::resnet50 {

namespace {

using SteadyClock = std::chrono::steady_clock;

double Since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

std::string Duration(double s) {
  char buf[32];
  const int64_t t = std::isfinite(s) && s >= 0 ? static_cast<int64_t>(s + 0.5) : 0;
  if (t >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", static_cast<long>(t / 3600),
                  static_cast<long>(t / 60 % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", static_cast<long>(t / 60),
                  static_cast<long>(t % 60));
  }
  return buf;
}

// Progress lines on rank 0 and the figures of LoopResult (on every rank).
class ProgressPrinter : public runtime::TrainingObserver {
 public:
  ProgressPrinter(const LoopOptions& o, std::ostream& out, LoopResult* result)
      : o_(o), out_(out), result_(result) {}

  void OnStep(const runtime::StepReport& r) override {
    if (!started_) {
      started_ = true;
      result_->first_loss = r.loss;
      window_epochs0_ = r.epochs_done;
    }
    // Skipped samples of the whole job (each trainer's own warning names its files), summed over
    // the epoch and printed on rank 0 when its last step (a step never spans two epochs) commits.
    const int64_t skipped = std::max<int64_t>(r.planned - r.samples, 0);
    epoch_skipped_ += skipped;
    epoch_planned_ += r.planned;
    result_->skipped += skipped;
    if (r.position.cursor == 0) {
      if (epoch_skipped_ > 0 && r.rank == 0) {
        out_ << "epoch " << r.position.epoch << ": " << epoch_skipped_ << " of " << epoch_planned_
             << " training samples were skipped as unreadable, all ranks together" << std::endl;
      }
      epoch_skipped_ = epoch_planned_ = 0;
    }
    window_loss_ += r.loss * r.samples;
    window_correct_ += r.correct;
    window_samples_ += r.samples;
    samples_total_ += r.samples;
    ++window_steps_;
    last_ = r;
    if (o_.log_every > 0 && r.step % o_.log_every == 0) Flush(true);
  }

  void OnEval(const runtime::EvalReport& r) override {
    result_->test_accuracy.push_back(r.accuracy);
    result_->test_loss = r.loss;
    if (r.rank == 0) {
      char line[256], top5[32] = "";
      if (r.accuracy_top5 >= 0)
        std::snprintf(top5, sizeof(top5), " top5 %.2f%%", 100.0 * r.accuracy_top5);
      std::snprintf(
          line, sizeof(line),
          "eval epoch %ld step %ld: test loss %.4f acc %.2f%%%s (%ld images, %d ranks, %.1f s)",
          static_cast<long>(r.epoch), static_cast<long>(r.step), r.loss, 100.0 * r.accuracy, top5,
          static_cast<long>(r.samples), r.world_size, r.seconds);
      out_ << line << std::endl;
    }
    window_start_ = SteadyClock::now();  // evaluation time is not training throughput
    eval_seconds_ += r.seconds;
  }

  // Closes the current window (a progress line when `print` and this is rank 0).
  void Flush(bool print) {
    if (window_samples_ == 0) return;
    const double dt = Since(window_start_);
    result_->last_window_loss = window_loss_ / window_samples_;
    const double epochs_per_s = dt > 0 ? (last_.epochs_done - window_epochs0_) / dt : 0;
    const double target = o_.elastic.epochs;
    const double eta = epochs_per_s > 0 ? (target - last_.epochs_done) / epochs_per_s : 0;
    if (print && last_.rank == 0) {
      char line[512];
      std::snprintf(line, sizeof(line),
                    "epoch %ld/%ld step %ld loss %.4f acc %.2f%% images/s %.1f lr %.5f "
                    "gen %ld world %d eta %s",
                    static_cast<long>(last_.position.epoch + (last_.position.cursor > 0 ? 1 : 0)),
                    static_cast<long>(std::ceil(o_.elastic.epochs)), static_cast<long>(last_.step),
                    result_->last_window_loss, 100.0 * window_correct_ / window_samples_,
                    dt > 0 ? window_samples_ / dt : 0.0, last_.lr,
                    static_cast<long>(last_.generation), last_.world_size, Duration(eta).c_str());
      out_ << line << std::endl;
    }
    window_loss_ = 0;
    window_correct_ = window_samples_ = window_steps_ = 0;
    window_start_ = SteadyClock::now();
    window_epochs0_ = last_.epochs_done;
  }

  int64_t samples_total() const { return samples_total_; }
  double eval_seconds() const { return eval_seconds_; }
  const runtime::StepReport& last() const { return last_; }

 private:
  const LoopOptions& o_;
  std::ostream& out_;
  LoopResult* const result_;
  bool started_ = false;
  runtime::StepReport last_;
  SteadyClock::time_point window_start_ = SteadyClock::now();
  double window_epochs0_ = 0, window_loss_ = 0, eval_seconds_ = 0;
  int64_t window_correct_ = 0, window_samples_ = 0, window_steps_ = 0, samples_total_ = 0;
  int64_t epoch_skipped_ = 0, epoch_planned_ = 0;
};

}  // namespace

Status RunTraining(runtime::Trainable* t, const LoopOptions& o,
                   runtime::MembershipSource* membership, std::ostream& out, LoopResult* result) {
  if (o.elastic.batch <= 0) return Status::InvalidArgument("--batch_size must be > 0");
  if (o.elastic.epochs <= 0) return Status::InvalidArgument("--epochs must be > 0");
  runtime::ElasticOptions eo = o.elastic;
  eo.lr.total_epochs = eo.epochs;
  eo.evaluate_each_epoch = o.eval && t->test_size() > 0;
  eo.eval_batch = std::max<int64_t>(eo.batch, 128);
  eo.progress_every = o.log_every > 0 ? static_cast<int>(std::min<int64_t>(o.log_every, 10)) : 10;
  ProgressPrinter printer(o, out, result);
  eo.observer = &printer;

  const auto start = SteadyClock::now();
  runtime::ElasticTrainer trainer(eo, t, membership);
  runtime::ElasticResult er;
  EDL_RETURN_IF_ERROR(trainer.Run(&er));
  if (!std::isfinite(er.last_loss)) {
    return Status::Aborted("training diverged by step " + std::to_string(er.step) +
                           " (loss is not finite); lower --lr");
  }
  printer.Flush(o.log_every > 0 && printer.last().step % o.log_every != 0);
  result->steps = er.step;
  result->left = er.left;
  result->generation = er.generation;
  result->state_hash = er.state_hash;
  result->seconds = Since(start);
  const double train_s = result->seconds - printer.eval_seconds();
  result->train_images_per_sec = train_s > 0 ? printer.samples_total() / train_s : 0;
  if (printer.last().rank != 0 && !er.left) return Status::OK();
  char line[512];
  if (er.left) {
    std::snprintf(line, sizeof(line), "left the job at generation %ld after step %ld",
                  static_cast<long>(er.generation), static_cast<long>(er.step));
    out << line << std::endl;
    return Status::OK();
  }
  const std::string acc =
      result->test_accuracy.empty()
          ? "n/a"
          : std::to_string(100.0 * result->test_accuracy.back()).substr(0, 5) + "%";
  std::snprintf(line, sizeof(line),
                "summary: %s steps %ld epochs %.2f final_train_loss %.4f test_acc %s "
                "train_images/s %.1f threads %d generation %ld world %d time %.1f s",
                o.label.c_str(), static_cast<long>(result->steps), printer.last().epochs_done,
                result->last_window_loss, acc.c_str(), result->train_images_per_sec, o.threads,
                static_cast<long>(er.generation), printer.last().world_size, result->seconds);
  out << line << std::endl;
  return Status::OK();
}

Status RunPlainAllReduce(runtime::Trainable* t, const LoopOptions& o,
                         runtime::MembershipSource* membership, std::ostream& out,
                         LoopResult* result) {
  if (t->on_device()) {
    return Status::InvalidArgument(
        "--plain_allreduce is the CPU/Gloo overhead baseline; use --device cpu");
  }
  runtime::Generation g;
  EDL_RETURN_IF_ERROR(membership->WaitGeneration(0, o.elastic.generation_wait, &g));
  const int rank = g.RankOf(membership->trainer_id());
  if (rank < 0) {
    return Status::FailedPrecondition("--plain_allreduce: trainer " + membership->trainer_id() +
                                      " is not a member of generation " + std::to_string(g.number));
  }
  runtime::CommOptions co;
  co.rank = rank;
  co.world_size = g.world_size();
  co.generation = g.number;
  co.key_prefix = "plain/" + std::to_string(g.number) + "/gloo";
  co.store = membership->kv();
  co.timeout = o.elastic.comm_timeout;
  auto comm = runtime::CreateGlooCommunicator(co);
  EDL_RETURN_IF_ERROR(comm.status());
  runtime::LrScheduleOptions lo = o.elastic.lr;
  lo.total_epochs = o.elastic.epochs;
  const runtime::LrSchedule schedule(lo);
  runtime::DataPlan plan(t->train_size(), o.elastic.seed);
  const std::vector<int64_t> b =
      runtime::BatchSizes(o.elastic.batch_policy, o.elastic.batch, g.world_size());
  int64_t global = 0;
  for (int64_t x : b) global += x;
  FILE* log = o.elastic.sample_log_path.empty()
                  ? nullptr
                  : std::fopen(o.elastic.sample_log_path.c_str(), "a");
  runtime::DataPosition pos;
  constexpr int64_t kWarmSteps = 5;
  int64_t step = 0, warm_samples = 0;
  double loss = 0;
  SteadyClock::time_point warm_t0 = SteadyClock::now();
  const auto start = SteadyClock::now();
  while (plan.EpochProgress(pos) < o.elastic.epochs &&
         (o.elastic.max_steps == 0 || step < o.elastic.max_steps)) {
    const std::vector<int64_t> idx = plan.Slice(pos, b, rank);
    const int64_t total = plan.StepSamples(pos, b);
    runtime::StepStats st;
    if (!idx.empty()) {
      t->SetEpoch(pos.epoch);
      EDL_RETURN_IF_ERROR(t->ForwardBackward(idx, &st));
      EDL_RETURN_IF_ERROR(t->ScaleGradients(static_cast<float>(idx.size()) / total));
    } else {
      EDL_RETURN_IF_ERROR(t->ZeroGradients());
    }
    size_t count = 0;
    float* grad = t->GradientBuffer(&count);
    EDL_RETURN_IF_ERROR(
        comm.value()->AllReduce(grad, count, runtime::DataType::kFloat32, runtime::ReduceOp::kSum));
    EDL_RETURN_IF_ERROR(t->ApplyUpdate(schedule.At(plan.EpochProgress(pos), global)));
    pos = plan.Advance(pos, b);
    ++step;
    if (st.samples > 0) loss = st.loss_sum / st.samples;
    if (step == kWarmSteps) warm_t0 = SteadyClock::now();
    if (step > kWarmSteps) warm_samples += total;
    if (log != nullptr) {
      const double now =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      std::fprintf(log, "{\"rank\":%d,\"step\":%ld,\"time\":%.6f}\n", rank, static_cast<long>(step),
                   now);
      std::fflush(log);
    }
  }
  if (log != nullptr) std::fclose(log);
  const double warm_s = Since(warm_t0);
  result->steps = step;
  result->seconds = Since(start);
  result->train_images_per_sec = warm_samples > 0 && warm_s > 0 ? warm_samples / warm_s : 0;
  result->last_window_loss = loss;
  if (rank == 0) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "plain: steps %ld world %d loss %.4f train_images/s %.1f time %.1f s",
                  static_cast<long>(step), g.world_size(), loss, result->train_images_per_sec,
                  result->seconds);
    out << line << std::endl;
  }
  return Status::OK();
}

Status RunStandaloneLoop(runtime::Trainable* t, const LoopOptions& o, std::ostream& out,
                         LoopResult* result) {
  auto membership =
      runtime::NewStaticMembership(0, 1, 1, std::make_unique<runtime::MemoryKvStore>());
  return RunTraining(t, o, membership.get(), out, result);
}

}  // namespace edl::resnet50
