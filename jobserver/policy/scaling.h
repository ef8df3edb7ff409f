// Scaling sources that change the job's desired size over time: a scaling script of timed events
// and the PaddlePaddle EDL demo's periodic remove-then-add policy. Both are pure: Poll(elapsed)
// returns the events that fell due since the last call, and the server applies them to the
// job (Cluster::SetDesired). Times are measured from the job's first generation, on a clock that
// the server pauses while a grow is being prepared (joiners loading): an event never cuts a join
// short.
//
// Script format (one event per line, '#' starts a comment; see config/*.script):
//   <when> <command>, <when> being either
//   <seconds>             on the scaling clock above, or
//   step <N>              once a trainer of the job has reported step N (its progress reports,
//                         every --log_every steps), or
//   step +<N>             once the job trained N steps more than when the line above took effect
//                         (counted from the first poll after it: a grow's joiners were ready then).
// Step lines land at the same point of training on a fast machine and a slow one (the demo
// test's script keys on them); a relative one also keeps its distance from a hot join however
// long the joiners took to start.
// Events happen in the order written: an event waits for every one above it. Times never go
// backwards among the timed lines, nor steps among the step lines. Commands:
//   set N                 desired size := N
//   add K                 desired size += K
//   remove K              desired size -= K
//   kill K                SIGKILL K running trainers (rehearses failures; they are grown back).
//                         Each death is noticed on its own, so survivors may re-form in between.
//   kill all              SIGKILL every running trainer in one step: the server commits the empty
//                         failure generation at once (nobody re-forms in between), then restarts
//                         the job from its latest checkpoint (the stop-resume baseline)
//   teachers SERVICE N    desired teacher count of inference service SERVICE := N (0..1024), as
//                         `edl ctl scale --service SERVICE N` (docs/DISTILLATION.md, "Teachers run
//                         by the clients")
//   repeat                start over from the top, shifted by <seconds>
// `repeat` is last, timed and later than 0, in a script without step lines (steps do not repeat).
//
// Thread-safety: none (one owner).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::jobserver {

struct ScaleEvent {
  enum class Op { kSet, kAdd, kRemove, kKill, kRepeat, kKillAll, kTeachers };
  Op op = Op::kSet;
  int n = 0;
  std::string service;   // kTeachers: a valid name (proto::IsValidName)
  int64_t at_us = 0;     // timed: due at this scaling-clock time (repetitions shifted)
  int64_t at_step = -1;  // >= 0: a step line, due once the job reached this step (at_us unused)
  bool step_relative = false;  // `step +N`: at_step counts from where the line above took effect
  std::string ToString() const;
};

class ScalingScript {
 public:
  // InvalidArgument naming `source` and the line on any malformed line.
  static Status Parse(const std::string& text, const std::string& source, ScalingScript* out);
  static Status Load(const std::string& path, ScalingScript* out);

  // Events due at or before `elapsed_us` (or, step lines, at or before the highest step observed)
  // not returned before, in order (a `repeat` is expanded, never returned). The server polls only
  // while no change is being prepared, so a `step +N` line counts from the first poll after the
  // previous event: for a grow, once its joiners were ready.
  std::vector<ScaleEvent> Poll(int64_t elapsed_us);
  // A trainer of the job reported `step` (the server calls it with every progress report; a
  // restarted server learns it again from the next reports). Only ever raises the step.
  void ObserveStep(int64_t step) { step_ = std::max(step_, step); }
  const std::vector<ScaleEvent>& events() const { return events_; }
  // Where Poll stands, to resume it in a restarted server (jobserver/state/STATE.md): the next
  // event's index and the shift of the current repetition. Resume clamps an index past the end.
  uint64_t position() const { return next_; }
  int64_t offset_us() const { return offset_us_; }
  void Resume(uint64_t position, int64_t offset_us) {
    next_ = static_cast<size_t>(std::min<uint64_t>(position, events_.size()));
    offset_us_ = offset_us;
  }

 private:
  std::vector<ScaleEvent> events_;
  size_t next_ = 0;
  int64_t offset_us_ = 0;
  int64_t step_ = -1;      // the highest step observed
  int64_t base_step_ = 0;  // where a `step +N` line counts from
  bool rebase_ = true;     // the next Poll sets base_step_ (the first one, and after an event)
};

// PaddlePaddle EDL demo policy, with the meaning its collective demo's job server gave the flags:
// each of the `node_ips` holds `pod_num_of_node` pods, and a node's `gpu_num_of_node` GPUs are
// split among its pods, gpu_num_of_node / pod_num_of_node per pod, one trainer per GPU. So the job
// starts at len(node_ips) * gpu_num_of_node trainers (8 per node with the defaults), and every
// `time_interval_to_change` seconds it alternately removes `del_pods_one_step` pods and adds
// `add_pods_one_step` back, a pod's trainers at a time (never below one pod nor above the start).
struct DemoPolicyOptions {
  std::vector<std::string> node_ips;
  int gpu_num_of_node = 8;
  int pod_num_of_node = 1;
  int time_interval_to_change_s = 900;
  int del_pods_one_step = 1;
  int add_pods_one_step = 1;
};

class DemoPolicy {
 public:
  explicit DemoPolicy(const DemoPolicyOptions& o);
  int initial_size() const { return total_; }
  int trainers_per_pod() const { return per_pod_; }
  // At most one event per elapsed interval: kSet with the new size.
  std::vector<ScaleEvent> Poll(int64_t elapsed_us);
  int size() const { return size_; }
  int64_t steps_done() const { return steps_done_; }
  // Resumes a saved policy (a size outside 1..start size is clamped).
  void Resume(int size, int64_t steps_done) {
    size_ = std::max(per_pod_, std::min(total_, size));
    steps_done_ = std::max<int64_t>(0, steps_done);
  }

 private:
  const DemoPolicyOptions options_;
  const int per_pod_;  // gpu_num_of_node / pod_num_of_node
  const int total_;
  int size_;
  int64_t steps_done_ = 0;
};

}  // namespace edl::jobserver
