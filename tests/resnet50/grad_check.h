// Helpers for the resnet50 op and model tests: host<->backend tensors in any layout and a
// finite-difference gradient checker.
//
// Numerics of the checker: ops run in fp32; the scalar loss L = sum(out .* R) (R fixed random) is
// accumulated in double; the numerical derivative is the central difference (L(x+h) - L(x-h)) / 2h
// with h = 1e-2, so fp32 rounding in L contributes ~1e-4 and the O(h^2) truncation is of the same
// order for smooth ops. An analytic gradient g passes when |g - num| <= atol + rtol *
// max(|g|,|num|) with rtol = 2e-2 and atol = 2e-3 unless a test says otherwise. Inputs of ReLU and
// max-pool are kept away from their kinks and ties so the finite difference does not cross one.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "resnet50/backend.h"
#include "tests/testutil.h"

namespace edl::resnet50::test {

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Uploads host data (row-major NCHW order) into `t`, converting to t's layout.
inline void Upload(Backend* be, const std::vector<float>& host, Tensor* t) {
  Tensor plain(be, t->shape(), Layout::kNCHW);
  ASSERT_OK(be->CopyFromHost(host.data(), &plain));
  ASSERT_OK(be->Copy(plain, t));
}

inline Tensor Make(Backend* be, const Shape& shape, Layout layout, const std::vector<float>& host) {
  Tensor t(be, shape, layout);
  Upload(be, host, &t);
  return t;
}

// Downloads `t` (any layout) into row-major NCHW host order.
inline std::vector<float> Download(Backend* be, const Tensor& t) {
  Tensor plain(be, t.shape(), Layout::kNCHW);
  EXPECT_OK(be->Copy(t, &plain));
  std::vector<float> host(t.numel());
  EXPECT_OK(be->CopyToHost(plain, host.data()));
  return host;
}

inline double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

struct GradCheckOptions {
  float h = 1e-2f;
  double rtol = 2e-2;
  double atol = 2e-3;
  int samples = 24;  // coordinates checked per input (spread over the buffer)
};

// Checks `analytic` = dL/d(*input) where loss() recomputes L from the current *input.
inline void CheckGrad(const std::string& what, std::vector<float>* input,
                      const std::vector<float>& analytic, const std::function<double()>& loss,
                      GradCheckOptions o = {}) {
  ASSERT_EQ(input->size(), analytic.size()) << what;
  const size_t n = input->size();
  const size_t step = std::max<size_t>(1, n / o.samples);
  double max_err = 0;
  for (size_t i = (n > 1 ? 1 : 0) % n; i < n; i += step) {
    const float saved = (*input)[i];
    (*input)[i] = saved + o.h;
    const double lp = loss();
    (*input)[i] = saved - o.h;
    const double lm = loss();
    (*input)[i] = saved;
    const double num = (lp - lm) / (2.0 * o.h);
    const double err = std::fabs(num - analytic[i]);
    max_err = std::max(max_err, err);
    EXPECT_LE(err, o.atol + o.rtol * std::max(std::fabs(num),
                                              std::fabs(static_cast<double>(analytic[i]))))
        << what << "[" << i << "]: analytic " << analytic[i] << " numerical " << num;
  }
  std::cout << "  grad check " << what << ": max |analytic - numerical| = " << max_err << "\n";
}

}  // namespace edl::resnet50::test
