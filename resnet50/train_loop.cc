#include "resnet50/train_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "edl/runtime/data_plan.h"

namespace edl::resnet50 {

namespace {

using SteadyClock = std::chrono::steady_clock;

double Since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

std::string Duration(double s) {
  char buf[32];
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", static_cast<long>(t / 3600), static_cast<long>(t / 60 % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", static_cast<long>(t / 60), static_cast<long>(t % 60));
  }
  return buf;
}

}  // namespace

Status EvaluateAll(runtime::Trainable* t, int64_t batch_size, double* loss, double* accuracy) {
  const int64_t n = t->test_size();
  if (n == 0) return Status::FailedPrecondition("no test split to evaluate on");
  double loss_sum = 0;
  int64_t correct = 0;
  std::vector<int64_t> idx;
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    idx.clear();
    for (int64_t i = begin; i < std::min(n, begin + batch_size); ++i) idx.push_back(i);
    runtime::StepStats s;
    EDL_RETURN_IF_ERROR(t->Evaluate(idx, &s));
    loss_sum += s.loss_sum;
    correct += s.correct;
  }
  *loss = loss_sum / n;
  *accuracy = static_cast<double>(correct) / n;
  return Status::OK();
}

Status RunStandaloneLoop(runtime::Trainable* t, const LoopOptions& o, std::ostream& out,
                         LoopResult* result) {
  if (o.batch_size <= 0) return Status::InvalidArgument("--batch_size must be > 0");
  if (o.epochs <= 0) return Status::InvalidArgument("--epochs must be > 0");
  runtime::LrScheduleOptions lro = o.lr;
  lro.total_epochs = static_cast<double>(o.epochs);
  runtime::LrSchedule schedule(lro);
  EDL_RETURN_IF_ERROR(schedule.Validate());

  runtime::DataPlan plan(t->train_size(), o.seed);
  const std::vector<int64_t> batches{o.batch_size};
  const int64_t steps_per_epoch = (t->train_size() + o.batch_size - 1) / o.batch_size;
  int64_t total_steps = steps_per_epoch * o.epochs;
  if (o.max_steps > 0) total_steps = std::min(total_steps, o.max_steps);

  runtime::DataPosition pos;
  const auto start = SteadyClock::now();
  auto window_start = start;
  double window_loss = 0, train_time = 0;
  int64_t window_correct = 0, window_samples = 0, samples_total = 0;
  bool evaluated_last = false;
  char line[512];
  t->Prefetch(plan.Slice(pos, batches, 0));
  while (pos.epoch < o.epochs && result->steps < total_steps) {
    const auto step_start = SteadyClock::now();
    const std::vector<int64_t> idx = plan.Slice(pos, batches, 0);
    const runtime::DataPosition next = plan.Advance(pos, batches);
    if (next.epoch < o.epochs) t->Prefetch(plan.Slice(next, batches, 0));
    const double lr = schedule.At(plan.EpochProgress(pos), o.batch_size);
    runtime::StepStats s;
    EDL_RETURN_IF_ERROR(t->ForwardBackward(idx, &s));
    EDL_RETURN_IF_ERROR(t->ApplyUpdate(lr));
    train_time += Since(step_start);
    if (!std::isfinite(s.loss_sum)) {
      return Status::Aborted("training diverged at step " + std::to_string(result->steps) +
                             " (loss is not finite); lower --lr");
    }
    if (result->steps == 0) result->first_loss = s.loss_sum / s.samples;
    ++result->steps;
    window_loss += s.loss_sum;
    window_correct += s.correct;
    window_samples += s.samples;
    samples_total += s.samples;
    evaluated_last = false;
    if (o.log_every > 0 && (result->steps % o.log_every == 0 || result->steps == total_steps)) {
      const double dt = Since(window_start);
      const double eta = (total_steps - result->steps) * train_time / result->steps;
      result->last_window_loss = window_loss / window_samples;
      std::snprintf(line, sizeof(line),
                    "epoch %ld/%ld step %ld/%ld loss %.4f acc %.2f%% images/s %.1f lr %.5f eta %s",
                    static_cast<long>(pos.epoch + 1), static_cast<long>(o.epochs),
                    static_cast<long>(result->steps), static_cast<long>(total_steps),
                    result->last_window_loss, 100.0 * window_correct / window_samples,
                    window_samples / dt, lr, Duration(eta).c_str());
      out << line << std::endl;
      window_loss = 0;
      window_correct = window_samples = 0;
      window_start = SteadyClock::now();
    }
    if (next.epoch != pos.epoch && o.eval && t->test_size() > 0) {
      const auto eval_start = SteadyClock::now();
      double loss, acc;
      EDL_RETURN_IF_ERROR(EvaluateAll(t, o.batch_size, &loss, &acc));
      result->test_accuracy.push_back(acc);
      result->test_loss = loss;
      evaluated_last = true;
      std::snprintf(line, sizeof(line), "eval epoch %ld: test loss %.4f acc %.2f%% (%ld images, %.1f s)",
                    static_cast<long>(pos.epoch + 1), loss, 100.0 * acc,
                    static_cast<long>(t->test_size()), Since(eval_start));
      out << line << std::endl;
      window_start = SteadyClock::now();
    }
    pos = next;
  }
  if (o.eval && !evaluated_last && t->test_size() > 0) {  // stopped mid-epoch by --max_steps
    double loss, acc;
    EDL_RETURN_IF_ERROR(EvaluateAll(t, o.batch_size, &loss, &acc));
    result->test_accuracy.push_back(acc);
    result->test_loss = loss;
    std::snprintf(line, sizeof(line), "eval step %ld: test loss %.4f acc %.2f%%",
                  static_cast<long>(result->steps), loss, 100.0 * acc);
    out << line << std::endl;
  }
  if (window_samples > 0) result->last_window_loss = window_loss / window_samples;
  result->seconds = Since(start);
  result->train_images_per_sec = train_time > 0 ? samples_total / train_time : 0;
  std::snprintf(line, sizeof(line),
                "summary: %s steps %ld epochs %.2f final_train_loss %.4f test_acc %s "
                "train_images/s %.1f threads %d time %.1f s",
                o.label.c_str(), static_cast<long>(result->steps),
                plan.EpochProgress(pos), result->last_window_loss,
                result->test_accuracy.empty()
                    ? "n/a"
                    : (std::to_string(100.0 * result->test_accuracy.back()).substr(0, 5) + "%")
                          .c_str(),
                result->train_images_per_sec, o.threads, result->seconds);
  out << line << std::endl;
  return Status::OK();
}

}  // namespace edl::resnet50
