#include "jobserver/policy/goodput_model.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace edl::jobserver {

namespace {

constexpr double kEps = 1e-9;  // tolerance of the ceil() of a ratio of integers

// ceil(x), ignoring a rounding error just above an integer.
int CeilInt(double x) { return static_cast<int>(std::ceil(x - kEps)); }

bool Finite(double x) { return std::isfinite(x); }

// Weighted least squares of y = a + b * x with a, b >= 0: the unconstrained fit, else b = 0
// (a = weighted mean), else a = 0 (a line through the origin), whichever constraint binds.
void FitLine(const std::vector<double>& x, const std::vector<double>& y,
             const std::vector<double>& w, double* a, double* b) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sw += w[i];
    sx += w[i] * x[i];
    sy += w[i] * y[i];
    sxx += w[i] * x[i] * x[i];
    sxy += w[i] * x[i] * y[i];
  }
  *a = sw > 0 ? sy / sw : 0;
  *b = 0;
  const double det = sw * sxx - sx * sx;
  if (det > 1e-12 * std::max(1.0, sw * sxx)) {
    const double fb = (sw * sxy - sx * sy) / det;
    const double fa = (sy - fb * sx) / sw;
    if (fb >= 0 && fa >= 0) {
      *a = fa;
      *b = fb;
    } else if (fb >= 0 && sxx > 0) {  // the intercept would go negative: through the origin
      *a = 0;
      *b = std::max(0.0, sxy / sxx);
    }  // else the slope would: the weighted mean
  }
  *a = std::max(0.0, *a);
}

}  // namespace

double GradSeconds(const ThroughputParams& p, double local_batch) {
  return p.grad_fixed_s + p.grad_per_sample_s * local_batch;
}

double SyncSeconds(const ThroughputParams& p, int nodes, int trainers) {
  if (trainers <= 1) return 0;
  const double extra = std::max(trainers - 2, 0);
  if (nodes <= 1) return p.intra_fixed_s + p.intra_per_trainer_s * extra;
  return p.inter_fixed_s + p.inter_per_trainer_s * extra;
}

namespace {

// (grad^g + sync^g)^(1/g), scaled by the larger term so that g = 10 cannot overflow.
double Overlapped(double grad, double sync, double g) {
  if (sync <= 0) return grad;
  if (g == 1) return grad + sync;
  const double top = std::max(grad, sync);
  if (!(top > 0)) return 0;
  return top * std::pow(std::pow(grad / top, g) + std::pow(sync / top, g), 1.0 / g);
}

}  // namespace

double StepSeconds(const ThroughputParams& p, int nodes, int trainers, double local_batch,
                   int accum_steps) {
  const double grad = GradSeconds(p, local_batch);
  const double sync = SyncSeconds(p, nodes, trainers);
  return accum_steps * grad + Overlapped(grad, sync, std::clamp(p.overlap, 1.0, 10.0));
}

double Efficiency(double noise_scale, int base_batch, double total_batch) {
  if (total_batch <= 0) return 0;
  const double phi = std::max(0.0, noise_scale);
  return (phi + base_batch) / (phi + total_batch);
}

double Goodput(const GoodputModel& m, int nodes, int trainers, int local_batch, int accum_steps) {
  const double step = StepSeconds(m.throughput, nodes, trainers, local_batch, accum_steps);
  if (!(step > 0)) return 0;
  const double total = static_cast<double>(trainers) * local_batch * (accum_steps + 1);
  return Efficiency(m.noise_scale, m.batch.base_batch, total) * total / step;
}

BatchChoice FixedBatch(const BatchLimits& b, int total_batch, int trainers) {
  BatchChoice c;
  if (trainers < 1) return c;
  const double local = static_cast<double>(total_batch) / trainers;
  const int max_local = std::max(1, b.max_local);
  c.accum_steps = std::max(0, CeilInt(local / max_local) - 1);
  c.local_batch = std::max({1, b.min_local, CeilInt(local / (c.accum_steps + 1))});
  c.local_batch = std::min(c.local_batch, max_local);
  c.total_batch = trainers * c.local_batch * (c.accum_steps + 1);
  return c;
}

BatchChoice SmallestBatch(const BatchLimits& b, int trainers) {
  const int total = std::max(b.base_batch, trainers * b.min_local);
  return FixedBatch(b, std::min(total, std::max(b.max_batch, b.base_batch)), trainers);
}

BatchChoice BestBatch(const GoodputModel& m, int nodes, int trainers) {
  const BatchLimits& b = m.batch;
  BatchChoice best;
  if (trainers < 1 || b.max_local < 1) return best;
  const double lo = std::max<double>(b.base_batch, static_cast<double>(trainers) * b.min_local);
  const double hi = b.max_batch;
  if (lo > hi) return best;
  // Candidates lo * r^i, r = (hi / lo)^(1 / (K - 1)); the last is hi itself.
  const double r = std::pow(hi / lo, 1.0 / (kBatchCandidates - 1));
  double total = lo;
  for (int i = 0; i < kBatchCandidates; ++i, total *= r) {
    if (i == kBatchCandidates - 1) total = hi;
    const double local = total / trainers;
    BatchChoice c;
    c.accum_steps = std::max(0, CeilInt(local / b.max_local) - 1);
    if (c.accum_steps > b.max_accum_steps) continue;
    c.local_batch = std::clamp(CeilInt(local / (c.accum_steps + 1)), b.min_local, b.max_local);
    // Rounding up may pass max_batch: round down instead where that stays within min_local.
    if (static_cast<double>(trainers) * c.local_batch * (c.accum_steps + 1) > hi) {
      c.local_batch = static_cast<int>(hi / (static_cast<double>(trainers) * (c.accum_steps + 1)));
      if (c.local_batch < b.min_local) continue;
    }
    c.total_batch = trainers * c.local_batch * (c.accum_steps + 1);
    c.goodput = Goodput(m, nodes, trainers, c.local_batch, c.accum_steps);
    if (c.goodput > best.goodput) best = c;
  }
  return best;
}

Status CheckBatchLimits(const std::string& what, const BatchLimits& b, int min_trainers) {
  auto bad = [&](const std::string& m) { return Status::InvalidArgument(what + ": " + m); };
  if (b.min_local < 1) {
    return bad("min_local " + std::to_string(b.min_local) +
               " is below 1: a trainer computes at least one sample per micro-batch");
  }
  if (b.max_local < b.min_local) {
    return bad("max_local " + std::to_string(b.max_local) + " < min_local " +
               std::to_string(b.min_local) +
               ": the most a trainer's memory holds must be at least the least that keeps it "
               "busy; lower min_local or raise max_local");
  }
  if (b.max_accum_steps < 0) {
    return bad("max_accum_steps " + std::to_string(b.max_accum_steps) +
               " is below 0: give 0 for a job that never accumulates micro-batches");
  }
  if (b.base_batch < 1) {
    return bad("base_batch " + std::to_string(b.base_batch) +
               " is below 1: give the total batch the job's hyper-parameters were tuned at");
  }
  if (b.max_batch < b.base_batch) {
    return bad("max_batch " + std::to_string(b.max_batch) + " < base_batch " +
               std::to_string(b.base_batch) +
               ": the largest batch the job accepts must be at least the one it was tuned at");
  }
  if (min_trainers >= 1 &&
      static_cast<double>(min_trainers) * b.min_local > static_cast<double>(b.max_batch)) {
    return bad(std::to_string(min_trainers) + " trainers (its min) at min_local " +
               std::to_string(b.min_local) + " need a batch of " +
               std::to_string(static_cast<double>(min_trainers) * b.min_local) +
               ", above max_batch " + std::to_string(b.max_batch) +
               ": lower min_trainers or min_local, or raise max_batch");
  }
  return Status::OK();
}

Status CheckGoodputModel(const std::string& what, const GoodputModel& m, int min_trainers) {
  const ThroughputParams& p = m.throughput;
  const double values[] = {p.grad_fixed_s,        p.grad_per_sample_s, p.intra_fixed_s,
                           p.intra_per_trainer_s, p.inter_fixed_s,     p.inter_per_trainer_s,
                           m.noise_scale,         m.reform_s};
  for (double v : values) {
    if (!Finite(v) || v < 0) {
      return Status::InvalidArgument(what +
                                     ": a throughput time, the noise scale or the re-form cost is "
                                     "negative or not a number; report measured, finite values");
    }
  }
  if (!(p.overlap >= 1 && p.overlap <= 10)) {
    return Status::InvalidArgument(what + ": overlap " + std::to_string(p.overlap) +
                                   " is outside 1..10");
  }
  if (m.measured_trainers < 0) {
    return Status::InvalidArgument(what + ": measured_trainers is negative");
  }
  if (m.measured_trainers > 0 && !(GradSeconds(p, m.batch.min_local) > 0)) {
    return Status::InvalidArgument(what +
                                   ": a fitted model must give a step a positive compute time");
  }
  return CheckBatchLimits(what, m.batch, min_trainers);
}

Status FitThroughput(const std::vector<StepMeasurement>& points, ThroughputParams* out) {
  if (points.empty()) return Status::InvalidArgument("no step time was measured yet");
  for (const StepMeasurement& q : points) {
    if (!(q.nodes >= 1 && q.nodes <= q.trainers) || !(q.local_batch >= 1) ||
        !(Finite(q.step_s) && q.step_s > 0) || !(Finite(q.sync_s) && q.sync_s >= 0)) {
      return Status::InvalidArgument(
          "a step measurement needs 1 <= nodes <= trainers, a micro-batch of at least 1 and "
          "finite times, step > 0 and all-reduce >= 0 (got nodes " +
          std::to_string(q.nodes) + ", trainers " + std::to_string(q.trainers) + ", batch " +
          std::to_string(q.local_batch) + ", step " + std::to_string(q.step_s) + " s, sync " +
          std::to_string(q.sync_s) + " s)");
    }
  }
  ThroughputParams p;
  // 1. The compute time of one micro-batch.
  std::vector<double> x, y, w;
  std::set<double> sizes;
  for (const StepMeasurement& q : points) {
    const double c = std::max(q.step_s - q.sync_s, 1e-3 * q.step_s);
    x.push_back(q.local_batch);
    y.push_back(c);
    w.push_back(1 / (c * c));
    sizes.insert(q.local_batch);
  }
  if (sizes.size() == 1) {
    double mean = 0;
    for (double c : y) mean += c / y.size();
    p.grad_fixed_s = mean / 2;
    p.grad_per_sample_s = mean / 2 / x[0];
  } else {
    FitLine(x, y, w, &p.grad_fixed_s, &p.grad_per_sample_s);
  }
  if (!(GradSeconds(p, *sizes.begin()) > 0)) p.grad_per_sample_s = y[0] / x[0];

  // 2-3. The all-reduce, for each overlap; the best fit wins.
  constexpr double kOverlaps[] = {1, 1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8, 10};
  double best_err = INFINITY;
  ThroughputParams best = p;
  for (double g : kOverlaps) {
    ThroughputParams t = p;
    t.overlap = g;
    std::vector<double> xi, yi, wi, xn, yn, wn;
    for (const StepMeasurement& q : points) {
      if (q.trainers <= 1) continue;
      const double grad = GradSeconds(t, q.local_batch);
      double sync = 0;
      if (q.step_s > grad) {
        sync = q.step_s * std::pow(1 - std::pow(grad / q.step_s, g), 1.0 / g);
      }
      const double extra = std::max(q.trainers - 2, 0);
      const double weight = 1 / (q.step_s * q.step_s);
      if (q.nodes == 1) {
        xi.push_back(extra), yi.push_back(sync), wi.push_back(weight);
      } else {
        xn.push_back(extra), yn.push_back(sync), wn.push_back(weight);
      }
    }
    if (!xi.empty()) FitLine(xi, yi, wi, &t.intra_fixed_s, &t.intra_per_trainer_s);
    if (!xn.empty()) FitLine(xn, yn, wn, &t.inter_fixed_s, &t.inter_per_trainer_s);
    if (xn.empty()) {
      t.inter_fixed_s = 1.1 * t.intra_fixed_s;
      t.inter_per_trainer_s = 1.1 * t.intra_per_trainer_s;
    }
    if (xi.empty()) {
      t.intra_fixed_s = t.inter_fixed_s;
      t.intra_per_trainer_s = t.inter_per_trainer_s;
    }
    double err = 0;
    for (const StepMeasurement& q : points) {
      const double pred = StepSeconds(t, q.nodes, q.trainers, q.local_batch, 0);
      const double d = std::log(std::max(pred, 1e-12)) - std::log(q.step_s);
      err += d * d;
    }
    if (err < best_err - 1e-12) {
      best_err = err;
      best = t;
    }
  }
  *out = best;
  return Status::OK();
}

}  // namespace edl::jobserver
