#include "tools/sched_sim/app_trace.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "tools/sched_sim/csv.h"

namespace edl::schedsim {

namespace {

// Linear between (x0, y0) and (x1, y1) at x; y0 when x0 == x1.
double Lerp(double x0, double y0, double x1, double y1, double x) {
  if (x1 == x0) return y0;
  return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

// The keys of `m` around x: the largest <= x and the smallest >= x, clamped to the ends.
template <typename Map>
std::pair<typename Map::const_iterator, typename Map::const_iterator> Around(const Map& m, int x) {
  auto hi = m.lower_bound(x);
  if (hi == m.end()) return {std::prev(hi), std::prev(hi)};
  if (hi->first == x || hi == m.begin()) return {hi, hi};
  return {std::prev(hi), hi};
}

}  // namespace

std::string RingKey(const std::vector<int>& per_node) {
  std::string digits;
  for (int k : per_node) {
    if (k <= 0) continue;
    if (k > 9) return "";
    digits += static_cast<char>('0' + k);
  }
  std::string best = digits;
  for (size_t i = 1; i < digits.size(); ++i) {
    best = std::min(best, digits.substr(i) + digits.substr(0, i));
  }
  return best;
}

StepTime AppTrace::AlongBatch(const Curve& c, double b) {
  if (b <= c.front().b) return {c.front().step, c.front().sync};
  if (b >= c.back().b) return {c.back().step, c.back().sync};
  auto hi =
      std::lower_bound(c.begin(), c.end(), b, [](const Point& p, double x) { return p.b < x; });
  auto lo = std::prev(hi);
  return {Lerp(lo->b, lo->step, hi->b, hi->step, b), Lerp(lo->b, lo->sync, hi->b, hi->sync, b)};
}

StepTime AppTrace::AtNodes(const std::map<int, Curve>& by_trainers, int trainers, double b) const {
  auto [lo, hi] = Around(by_trainers, trainers);
  const StepTime a = AlongBatch(lo->second, b);
  const StepTime z = AlongBatch(hi->second, b);
  const int x = std::clamp(trainers, lo->first, hi->first);
  return {Lerp(lo->first, a.step_s, hi->first, z.step_s, x),
          Lerp(lo->first, a.sync_s, hi->first, z.sync_s, x)};
}

StepTime AppTrace::OnGrid(int nodes, int trainers, double b) const {
  auto [lo, hi] = Around(by_size_, nodes);
  const StepTime a = AtNodes(lo->second, trainers, b);
  const StepTime z = AtNodes(hi->second, trainers, b);
  const int x = std::clamp(nodes, lo->first, hi->first);
  return {Lerp(lo->first, a.step_s, hi->first, z.step_s, x),
          Lerp(lo->first, a.sync_s, hi->first, z.sync_s, x)};
}

StepTime AppTrace::Step(const std::vector<int>& per_node, double local_batch) const {
  const std::string key = RingKey(per_node);
  auto it = by_placement_.find(key);
  if (it != by_placement_.end()) return AlongBatch(it->second, local_batch);
  int nodes = 0, trainers = 0;
  for (int k : per_node) {
    nodes += k > 0;
    trainers += std::max(k, 0);
  }
  return OnGrid(nodes, trainers, local_batch);
}

double AppTrace::StepSeconds(const std::vector<int>& per_node, int local_batch,
                             int accum_steps) const {
  const StepTime t = Step(per_node, local_batch);
  return t.step_s + accum_steps * std::max(0.0, t.step_s - t.sync_s);
}

GradStats AppTrace::Grad(double total_batch, int epoch) const {
  auto at = [&](const std::vector<GradStats>& v) {
    return v[std::clamp(epoch, 0, static_cast<int>(v.size()) - 1)];
  };
  const int m = static_cast<int>(std::min(total_batch, 2e9));
  auto [lo, hi] = Around(grad_, m);
  const GradStats a = at(lo->second), z = at(hi->second);
  const double x = std::clamp<double>(total_batch, lo->first, hi->first);
  return {Lerp(lo->first, a.sqr, hi->first, z.sqr, x), Lerp(lo->first, a.var, hi->first, z.var, x)};
}

double AppTrace::Gain(double total_batch, int epoch) const {
  const GradStats g = Grad(total_batch, epoch);
  const double denom = g.var * limits_.base_batch / total_batch + g.sqr;
  if (!(denom > 0)) return 1;
  return (g.var + g.sqr) / denom;
}

Status AppTrace::LoadSteps(const std::string& dir) {
  const std::string base = dir + "/traces/" + settings_.name + "/";
  // (nodes, trainers, micro-batch) -> sum of steps, syncs and count, for the grid.
  std::map<std::tuple<int, int, double>, std::array<double, 3>> grid;
  auto check_times = [](const CsvTable& t, size_t r, double b, double step, double sync) {
    if (!(b >= 1)) {
      return Status::InvalidArgument(t.Where(r) + ": local_bsz " + std::to_string(b) +
                                     " is below 1: a micro-batch holds at least one sample");
    }
    if (!(step > 0) || sync < 0) {
      return Status::InvalidArgument(t.Where(r) +
                                     ": step_time must be positive and sync_time non-negative "
                                     "(seconds measured per step); fix or drop the row");
    }
    if (sync > step) {
      return Status::InvalidArgument(t.Where(r) + ": sync_time " + std::to_string(sync) +
                                     " s exceeds step_time " + std::to_string(step) +
                                     " s: the all-reduce is part of the step");
    }
    return Status::OK();
  };
  CsvTable p;
  EDL_RETURN_IF_ERROR(
      ReadCsv(base + "placements.csv", {"placement", "local_bsz", "step_time", "sync_time"}, &p));
  if (p.rows.empty()) return Status::InvalidArgument(p.path + ": no measured step; add rows");
  limits_.min_local = INT32_MAX;
  limits_.max_local = 0;
  for (size_t r = 0; r < p.rows.size(); ++r) {
    const std::string& digits = p.Field(r, "placement");
    std::vector<int> per_node;
    for (char c : digits) {
      if (c < '1' || c > '9') {
        return Status::InvalidArgument(p.Where(r) + ": placement '" + digits +
                                       "' is not trainers per node as digits 1-9 (e.g. 1122)");
      }
      per_node.push_back(c - '0');
    }
    if (per_node.empty()) return Status::InvalidArgument(p.Where(r) + ": empty placement");
    double b = 0, step = 0, sync = 0;
    EDL_RETURN_IF_ERROR(p.Double(r, "local_bsz", &b));
    EDL_RETURN_IF_ERROR(p.Double(r, "step_time", &step));
    EDL_RETURN_IF_ERROR(p.Double(r, "sync_time", &sync));
    EDL_RETURN_IF_ERROR(check_times(p, r, b, step, sync));
    by_placement_[RingKey(per_node)].push_back({b, step, sync});
    int trainers = 0;
    for (int k : per_node) trainers += k;
    auto& g = grid[{static_cast<int>(per_node.size()), trainers, b}];
    g[0] += step, g[1] += sync, g[2] += 1;
    limits_.min_local = std::min(limits_.min_local, static_cast<int>(b));
    limits_.max_local = std::max(limits_.max_local, static_cast<int>(b));
  }
  CsvTable s;
  EDL_RETURN_IF_ERROR(ReadCsv(base + "scalability.csv",
                              {"num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"},
                              &s));
  for (size_t r = 0; r < s.rows.size(); ++r) {
    int64_t nodes = 0, trainers = 0;
    double b = 0, step = 0, sync = 0;
    EDL_RETURN_IF_ERROR(s.Int(r, "num_nodes", &nodes));
    EDL_RETURN_IF_ERROR(s.Int(r, "num_replicas", &trainers));
    EDL_RETURN_IF_ERROR(s.Double(r, "local_bsz", &b));
    EDL_RETURN_IF_ERROR(s.Double(r, "step_time", &step));
    EDL_RETURN_IF_ERROR(s.Double(r, "sync_time", &sync));
    if (nodes < 1 || trainers < nodes || trainers > 1'000'000) {
      return Status::InvalidArgument(s.Where(r) + ": num_nodes " + std::to_string(nodes) +
                                     " and num_replicas " + std::to_string(trainers) +
                                     ": need 1 <= num_nodes <= num_replicas");
    }
    EDL_RETURN_IF_ERROR(check_times(s, r, b, step, sync));
    auto& g = grid[{static_cast<int>(nodes), static_cast<int>(trainers), b}];
    g[0] += step, g[1] += sync, g[2] += 1;
  }
  for (const auto& [key, g] : grid) {
    const auto& [nodes, trainers, b] = key;
    by_size_[nodes][trainers].push_back({b, g[0] / g[2], g[1] / g[2]});
  }
  for (auto& [key, c] : by_placement_) {
    std::stable_sort(c.begin(), c.end(), [](const Point& a, const Point& b) { return a.b < b.b; });
  }
  if (settings_.max_local_bsz > 0) limits_.max_local = settings_.max_local_bsz;
  return Status::OK();
}

Status AppTrace::LoadValidation(const std::string& dir) {
  const std::string folder = dir + "/traces/" + settings_.name;
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(folder, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("validation-", 0) == 0) files.push_back(f);
  }
  if (ec) return Status::NotFound(folder + ": cannot list it: " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    return Status::InvalidArgument(folder +
                                   ": no validation-<batch>.csv: the statistical "
                                   "efficiency needs gradient statistics per batch size");
  }
  for (const std::string& f : files) {
    const std::string path = folder + "/" + f;
    const std::string mid = f.substr(11, f.size() >= 15 ? f.size() - 15 : 0);
    const bool digits = !mid.empty() && mid.size() <= 9 &&
                        mid.find_first_not_of("0123456789") == std::string::npos && f.size() > 15 &&
                        f.substr(f.size() - 4) == ".csv";
    if (!digits || std::stoi(mid) < 1) {
      return Status::InvalidArgument(path +
                                     ": name it validation-<total batch>.csv, the batch a "
                                     "positive whole number");
    }
    const int batch = std::stoi(mid);
    CsvTable t;
    EDL_RETURN_IF_ERROR(ReadCsv(path, {"progress", "grad_sqr", "grad_var"}, &t));
    if (static_cast<int>(t.rows.size()) < settings_.max_epochs) {
      return Status::InvalidArgument(
          path + ": " + std::to_string(t.rows.size()) + " epochs, fewer than the " +
          std::to_string(settings_.max_epochs) + " applications.csv asks of " + settings_.name +
          ": lower its max_epochs or add the missing epochs");
    }
    std::vector<GradStats> stats;
    double last = 0;
    for (size_t r = 0; r < t.rows.size(); ++r) {
      double progress = 0;
      GradStats g;
      EDL_RETURN_IF_ERROR(t.Double(r, "progress", &progress));
      EDL_RETURN_IF_ERROR(t.Double(r, "grad_sqr", &g.sqr));
      EDL_RETURN_IF_ERROR(t.Double(r, "grad_var", &g.var));
      if (progress < last || g.sqr < 0 || g.var < 0 || !(g.sqr + g.var > 0)) {
        return Status::InvalidArgument(
            t.Where(r) +
            ": progress must not fall and must be non-negative; grad_sqr and "
            "grad_var non-negative and not both 0");
      }
      last = progress;
      stats.push_back(g);
      if (static_cast<int>(r) < settings_.max_epochs) {
        if (epoch_end_.size() <= r) epoch_end_.push_back(progress);
        epoch_end_[r] = std::min(epoch_end_[r], progress);
      }
    }
    grad_[batch] = std::move(stats);
  }
  for (size_t e = 0; e < epoch_end_.size(); ++e) {
    if (!(epoch_end_[e] > (e == 0 ? 0 : epoch_end_[e - 1]))) {
      return Status::InvalidArgument(folder + ": epoch " + std::to_string(e) +
                                     " makes no progress in some validation file: each epoch's "
                                     "progress must exceed the one before");
    }
  }
  limits_.base_batch = grad_.begin()->first;
  limits_.max_batch = grad_.rbegin()->first;
  return Status::OK();
}

Status AppTrace::Load(const std::string& dir, const AppSettings& settings, AppTrace* out) {
  *out = AppTrace();
  out->settings_ = settings;
  EDL_RETURN_IF_ERROR(out->LoadSteps(dir));
  EDL_RETURN_IF_ERROR(out->LoadValidation(dir));
  return jobserver::CheckBatchLimits(
      "application " + settings.name + " (" + dir + "/traces/" + settings.name +
          ": batches from the validation files' names, micro-batches from placements.csv and "
          "max_local_bsz in applications.csv)",
      out->limits_, 1);
}

Status LoadApps(const std::string& dir, std::map<std::string, AppTrace>* out) {
  CsvTable t;
  EDL_RETURN_IF_ERROR(
      ReadCsv(dir + "/applications.csv", {"application", "max_epochs", "max_local_bsz"}, &t));
  out->clear();
  for (size_t r = 0; r < t.rows.size(); ++r) {
    AppSettings s;
    s.name = t.Field(r, "application");
    int64_t epochs = 0, max_local = 0;
    EDL_RETURN_IF_ERROR(t.Int(r, "max_epochs", &epochs));
    EDL_RETURN_IF_ERROR(t.Int(r, "max_local_bsz", &max_local));
    if (s.name.empty() || s.name.find_first_of("/.") != std::string::npos) {
      return Status::InvalidArgument(t.Where(r) + ": application '" + s.name +
                                     "' must name a folder under traces/");
    }
    if (epochs < 1 || epochs > 100000 || max_local < 0 || max_local > 1'000'000'000) {
      return Status::InvalidArgument(t.Where(r) +
                                     ": max_epochs must be 1..100000 and max_local_bsz >= 0 "
                                     "(0: the largest micro-batch in placements.csv)");
    }
    if (out->count(s.name) > 0) {
      return Status::InvalidArgument(t.Where(r) + ": application " + s.name + " is listed twice");
    }
    s.max_epochs = static_cast<int>(epochs);
    s.max_local_bsz = static_cast<int>(max_local);
    EDL_RETURN_IF_ERROR(AppTrace::Load(dir, s, &(*out)[s.name]).WithContext(t.Where(r)));
  }
  if (out->empty()) {
    return Status::InvalidArgument(t.path +
                                   ": lists no application; add one line per folder "
                                   "under traces/");
  }
  return Status::OK();
}

}  // namespace edl::schedsim
