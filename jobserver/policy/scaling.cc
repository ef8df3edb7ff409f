#include "jobserver/policy/scaling.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"

namespace edl::jobserver {

std::string ScaleEvent::ToString() const {
  static const char* kNames[] = {"set", "add", "remove", "kill", "repeat", "kill all", "teachers"};
  const std::string when =
      at_step >= 0 ? std::string(step_relative ? "step +" : "step ") + std::to_string(at_step)
                   : std::to_string(static_cast<double>(at_us) * 1e-6);
  if (op == Op::kTeachers) return when + " teachers " + service + " " + std::to_string(n);
  return when + " " + kNames[static_cast<int>(op)] +
         (op == Op::kRepeat || op == Op::kKillAll ? "" : " " + std::to_string(n));
}

Status ScalingScript::Parse(const std::string& text, const std::string& source,
                            ScalingScript* out) {
  ScalingScript s;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  int64_t last = 0;       // the latest time of a timed line
  int64_t last_step = 0;  // the latest step of a step line
  bool stepped = false;   // a step line was seen
  bool repeated = false;
  while (std::getline(in, line)) {
    ++lineno;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string t, cmd, arg, extra;
    if (!(ls >> t)) continue;
    const std::string where = source + ":" + std::to_string(lineno) + ": ";
    if (repeated) return Status::InvalidArgument(where + "nothing may follow 'repeat'");
    char* end = nullptr;
    ScaleEvent e;
    if (t == "step") {
      // `step N <command>`: due once the job reached step N; `step +N`: N steps after the line
      // above.
      std::string n;
      ls >> n;
      e.step_relative = !n.empty() && n[0] == '+';
      const std::string digits = e.step_relative ? n.substr(1) : n;
      const long long step = std::strtoll(digits.c_str(), &end, 10);
      if (digits.empty() || !std::isdigit(static_cast<unsigned char>(digits[0])) || *end != '\0' ||
          step > 1'000'000'000'000LL) {
        return Status::InvalidArgument(where + "step '" + n.substr(0, 32) +
                                       "' is not an integer >= 0 nor +N");
      }
      if (!e.step_relative && step < last_step) {
        return Status::InvalidArgument(where + "steps must not go backwards");
      }
      e.at_step = step;
      if (!e.step_relative) last_step = step;
      e.at_us = last;  // keeps at_us ordered for the readers of timed events
      stepped = true;
    } else {
      const double secs = std::strtod(t.c_str(), &end);
      if (*end != '\0' || !std::isfinite(secs) || secs < 0 || secs > 1e7) {
        return Status::InvalidArgument(where + "time '" + t.substr(0, 32) +
                                       "' is not a number of seconds >= 0 nor 'step N'");
      }
      e.at_us = static_cast<int64_t>(secs * 1e6);
      if (e.at_us < last) return Status::InvalidArgument(where + "times must not go backwards");
      last = e.at_us;
    }
    if (!(ls >> cmd)) {
      return Status::InvalidArgument(
          where + "expected '<seconds> <command> [N]' or 'step <N> <command> [N]'");
    }
    if (cmd == "repeat") {
      if (e.at_step >= 0 || stepped) {
        return Status::InvalidArgument(where +
                                       "'repeat' in a script with step lines (steps do not repeat; "
                                       "write the events out)");
      }
      if (e.at_us == 0) return Status::InvalidArgument(where + "'repeat' needs a time > 0");
      e.op = ScaleEvent::Op::kRepeat;
      repeated = true;
    } else {
      if (cmd == "set")
        e.op = ScaleEvent::Op::kSet;
      else if (cmd == "add")
        e.op = ScaleEvent::Op::kAdd;
      else if (cmd == "remove")
        e.op = ScaleEvent::Op::kRemove;
      else if (cmd == "kill")
        e.op = ScaleEvent::Op::kKill;
      else if (cmd == "teachers")
        e.op = ScaleEvent::Op::kTeachers;
      else
        return Status::InvalidArgument(where + "unknown command '" + cmd.substr(0, 32) +
                                       "' (use set, add, remove, kill, teachers or repeat)");
      if (e.op == ScaleEvent::Op::kTeachers) {
        std::string service;
        if (!(ls >> service) || !(ls >> arg)) {
          return Status::InvalidArgument(where + "write 'teachers SERVICE N'");
        }
        if (!proto::IsValidName(service)) {
          return Status::InvalidArgument(where + "service name '" + service.substr(0, 32) +
                                         "' is not a name of letters, digits, '.', '_', '-'");
        }
        const long n = std::strtol(arg.c_str(), &end, 10);
        if (arg.empty() || *end != '\0' || n < 0 ||
            n > static_cast<long>(proto::kMaxServiceMembers)) {
          return Status::InvalidArgument(where + "teacher count '" + arg.substr(0, 32) +
                                         "' is not an integer in 0.." +
                                         std::to_string(proto::kMaxServiceMembers));
        }
        e.service = std::move(service);
        e.n = static_cast<int>(n);
        if (ls >> extra)
          return Status::InvalidArgument(where + "unexpected '" + extra.substr(0, 32) + "'");
        s.events_.push_back(e);
        continue;
      }
      if (!(ls >> arg)) return Status::InvalidArgument(where + "'" + cmd + "' needs a count");
      if (e.op == ScaleEvent::Op::kKill && arg == "all") {
        e.op = ScaleEvent::Op::kKillAll;
        if (ls >> extra) return Status::InvalidArgument(where + "unexpected '" + extra + "'");
        s.events_.push_back(e);
        continue;
      }
      const long n = std::strtol(arg.c_str(), &end, 10);
      if (*end != '\0' || n < 0 || n > 100000 || (n == 0 && e.op != ScaleEvent::Op::kSet)) {
        return Status::InvalidArgument(
            where + "count '" + arg + "' is not a positive integer" +
            std::string(e.op == ScaleEvent::Op::kKill ? " or 'all'" : ""));
      }
      e.n = static_cast<int>(n);
    }
    if (ls >> extra) return Status::InvalidArgument(where + "unexpected '" + extra + "'");
    s.events_.push_back(e);
  }
  *out = std::move(s);
  return Status::OK();
}

Status ScalingScript::Load(const std::string& path, ScalingScript* out) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("--scale_script " + path + ": cannot read the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path, out);
}

std::vector<ScaleEvent> ScalingScript::Poll(int64_t elapsed_us) {
  std::vector<ScaleEvent> due;
  if (rebase_) {
    base_step_ = std::max<int64_t>(0, step_);
    rebase_ = false;
  }
  while (next_ < events_.size()) {
    const ScaleEvent& next = events_[next_];
    if (next.step_relative && !due.empty()) break;  // counts from the next poll (see Poll)
    if (next.at_step >= 0 ? step_ < (next.step_relative ? base_step_ : 0) + next.at_step
                          : offset_us_ + next.at_us > elapsed_us) {
      break;
    }
    ScaleEvent e = events_[next_++];
    if (e.op != ScaleEvent::Op::kRepeat) rebase_ = true;
    if (e.op == ScaleEvent::Op::kRepeat) {
      offset_us_ += e.at_us;
      next_ = 0;
      continue;
    }
    e.at_us += offset_us_;
    due.push_back(e);
  }
  return due;
}

DemoPolicy::DemoPolicy(const DemoPolicyOptions& o)
    : options_(o),
      per_pod_(std::max(1, o.gpu_num_of_node / std::max(1, o.pod_num_of_node))),
      total_(
          std::max<int>(1, static_cast<int>(o.node_ips.size()) * std::max(1, o.pod_num_of_node)) *
          per_pod_),
      size_(total_) {}

std::vector<ScaleEvent> DemoPolicy::Poll(int64_t elapsed_us) {
  std::vector<ScaleEvent> due;
  const int64_t interval = int64_t{std::max(1, options_.time_interval_to_change_s)} * 1'000'000;
  while ((steps_done_ + 1) * interval <= elapsed_us) {
    ++steps_done_;
    const bool remove = steps_done_ % 2 == 1;  // remove first, then add back
    size_ = remove ? std::max(per_pod_, size_ - options_.del_pods_one_step * per_pod_)
                   : std::min(total_, size_ + options_.add_pods_one_step * per_pod_);
    ScaleEvent e;
    e.op = ScaleEvent::Op::kSet;
    e.n = size_;
    e.at_us = steps_done_ * interval;
    due.push_back(e);
  }
  return due;
}

}  // namespace edl::jobserver
