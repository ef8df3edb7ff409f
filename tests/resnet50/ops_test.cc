// Numerical gradient checks of every backend op (see grad_check.h for the tolerance), plus BN
// train/eval semantics and running statistics against hand-computed values. Parameterized over
// backends; an unavailable one (CUDA without a GPU) is skipped.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "edl/config.h"
#include "resnet50/backend.h"
#include "tests/resnet50/grad_check.h"
#include "tests/testutil.h"

namespace edl::resnet50::test {
namespace {

class OpsTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto be = CreateBackend(GetParam(), BackendOptions{});
    // No GPU here: skip. A CUDA build whose plugin does not load (FailedPrecondition) fails.
    if (!be.ok() && (be.status().code() == Status::Code::kUnavailable || !EDL_HAVE_CUDA)) {
      GTEST_SKIP() << GetParam() << " backend unavailable: " << be.status().ToString();
    }
    ASSERT_TRUE(be.ok()) << be.status().ToString();
    be_ = std::move(be.value());
  }
  Backend* be() { return be_.get(); }
  std::unique_ptr<Backend> be_;
};

// ---- convolution: dx and dw for the shapes ResNet uses (3x3 s1/s2, 1x1 s2, 7x7 s2 stem on NCHW)
struct ConvCase {
  int64_t n, c, h, k;
  Conv2dParams p;
  Layout in_layout;
};

TEST_P(OpsTest, Conv2dGradients) {
  const ConvCase cases[] = {
      {2, 16, 6, 16, {3, 1, 1}, Layout::kNative}, {2, 16, 7, 32, {3, 2, 1}, Layout::kNative},
      {2, 16, 6, 32, {1, 2, 0}, Layout::kNative}, {2, 3, 9, 16, {7, 2, 3}, Layout::kNCHW},
      {2, 1, 8, 16, {3, 1, 1}, Layout::kNCHW},
  };
  for (const ConvCase& cc : cases) {
    SCOPED_TRACE("conv c=" + std::to_string(cc.c) + " k=" + std::to_string(cc.p.kernel) +
                 " s=" + std::to_string(cc.p.stride));
    const int64_t oh = cc.p.OutSize(cc.h);
    const Shape xs{cc.n, cc.c, cc.h, cc.h}, ws{cc.k, cc.c, cc.p.kernel, cc.p.kernel},
        ys{cc.n, cc.k, oh, oh};
    std::vector<float> xh = RandomVector(Numel(xs), 1), wh = RandomVector(Numel(ws), 2, -.3f, .3f),
                       r = RandomVector(Numel(ys), 3);
    Tensor x = Make(be(), xs, cc.in_layout, xh), w = Make(be(), ws, Layout::kNCHW, wh);
    Tensor y(be(), ys, Layout::kNative), dy = Make(be(), ys, Layout::kNative, r);
    Tensor dx(be(), xs, cc.in_layout), dw(be(), ws, Layout::kNCHW);
    ASSERT_OK(be()->Conv2dForward(cc.p, x, w, &y));
    ASSERT_OK(be()->Conv2dBackwardFilter(cc.p, x, dy, &dw));
    ASSERT_OK(be()->Conv2dBackwardData(cc.p, dy, w, &dx));
    auto loss = [&] {
      Upload(be(), xh, &x);
      Upload(be(), wh, &w);
      EXPECT_OK(be()->Conv2dForward(cc.p, x, w, &y));
      return Dot(Download(be(), y), r);
    };
    CheckGrad("conv dx", &xh, Download(be(), dx), loss);
    CheckGrad("conv dw", &wh, Download(be(), dw), loss);
  }
}

// ---- batch norm (training mode, with and without the fused ReLU)
TEST_P(OpsTest, BatchNormGradients) {
  for (bool fuse : {false, true}) {
    SCOPED_TRACE(fuse ? "bn+relu" : "bn");
    const Shape xs{3, 16, 4, 4}, cs{16};
    std::vector<float> xh = RandomVector(Numel(xs), 4, -2.f, 3.f),
                       gh = RandomVector(16, 5, .5f, 1.5f), bh = RandomVector(16, 6, -.5f, .5f),
                       r = RandomVector(Numel(xs), 7);
    Tensor x = Make(be(), xs, Layout::kNative, xh), g = Make(be(), cs, Layout::kNCHW, gh),
           b = Make(be(), cs, Layout::kNCHW, bh);
    Tensor y(be(), xs, Layout::kNative), dy = Make(be(), xs, Layout::kNative, r);
    Tensor mean(be(), cs), inv(be(), cs), rm(be(), cs), rv(be(), cs);
    Tensor dx(be(), xs, Layout::kNative), dg(be(), cs), db(be(), cs);
    ASSERT_OK(be()->Fill(&rm, 0.f));
    ASSERT_OK(be()->Fill(&rv, 1.f));
    BatchNormParams p;
    p.fuse_relu = fuse;
    ASSERT_OK(be()->BatchNormForwardTraining(p, x, g, b, &y, &mean, &inv, &rm, &rv));
    ASSERT_OK(be()->BatchNormBackward(p, x, dy, &y, g, mean, inv, &dx, &dg, &db));
    auto loss = [&] {
      Upload(be(), xh, &x);
      Upload(be(), gh, &g);
      Upload(be(), bh, &b);
      EXPECT_OK(be()->BatchNormForwardTraining(p, x, g, b, &y, &mean, &inv, &rm, &rv));
      return Dot(Download(be(), y), r);
    };
    GradCheckOptions o;
    o.h = fuse ? 2e-3f : 1e-2f;  // smaller step so few outputs cross the ReLU kink
    o.atol = fuse ? 1e-2 : 2e-3;
    CheckGrad("bn dx", &xh, Download(be(), dx), loss, o);
    CheckGrad("bn dgamma", &gh, Download(be(), dg), loss, o);
    CheckGrad("bn dbeta", &bh, Download(be(), db), loss, o);
  }
}

// BN semantics against hand-computed values: one channel, 4 values.
TEST_P(OpsTest, BatchNormTrainEvalAndRunningStats) {
  const Shape xs{2, 1, 1, 2}, cs{1};
  const std::vector<float> xh{1.f, 2.f, 3.f, 6.f};  // mean 3, biased var 3.5, unbiased 14/3
  Tensor x = Make(be(), xs, Layout::kNCHW, xh), y(be(), xs, Layout::kNCHW);
  Tensor g = Make(be(), cs, Layout::kNCHW, {2.f}), b = Make(be(), cs, Layout::kNCHW, {0.5f});
  Tensor mean(be(), cs), inv(be(), cs), rm = Make(be(), cs, Layout::kNCHW, {1.f}),
                                        rv = Make(be(), cs, Layout::kNCHW, {2.f});
  BatchNormParams p;
  p.eps = 1e-5f;
  p.momentum = 0.1f;
  ASSERT_OK(be()->BatchNormForwardTraining(p, x, g, b, &y, &mean, &inv, &rm, &rv));
  const double invstd = 1.0 / std::sqrt(3.5 + 1e-5);
  std::vector<float> yh = Download(be(), y);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(yh[i], 2.0 * (xh[i] - 3.0) * invstd + 0.5, 1e-5);
  EXPECT_NEAR(Download(be(), mean)[0], 3.0, 1e-6);
  EXPECT_NEAR(Download(be(), inv)[0], invstd, 1e-6);
  EXPECT_NEAR(Download(be(), rm)[0], 0.9 * 1.0 + 0.1 * 3.0, 1e-6);
  EXPECT_NEAR(Download(be(), rv)[0], 0.9 * 2.0 + 0.1 * 14.0 / 3.0, 1e-5);
  // Eval mode normalises with the running statistics, not the batch's, and changes nothing else.
  ASSERT_OK(be()->BatchNormForwardInference(p, x, g, b, rm, rv, &y));
  yh = Download(be(), y);
  const double rmean = 1.2, rvar = 1.8 + 1.4 / 3.0 * 1.0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(yh[i], 2.0 * (xh[i] - rmean) / std::sqrt(rvar + 1e-5) + 0.5, 1e-5);
  }
  EXPECT_NEAR(Download(be(), rm)[0], 1.2, 1e-6);
  // Fused ReLU in eval mode clamps at zero.
  p.fuse_relu = true;
  Tensor nb = Make(be(), cs, Layout::kNCHW, {-0.5f});
  ASSERT_OK(be()->BatchNormForwardInference(p, x, g, nb, rm, rv, &y));
  yh = Download(be(), y);
  for (int i = 0; i < 4; ++i) {
    const double want = 2.0 * (xh[i] - rmean) / std::sqrt(rvar + 1e-5) - 0.5;
    EXPECT_NEAR(yh[i], std::max(0.0, want), 1e-5);
  }
  EXPECT_EQ(yh[0], 0.f);
}

// ---- element-wise
TEST_P(OpsTest, ReluAndAddGradients) {
  const Shape s{2, 16, 3, 3};
  std::vector<float> xh = RandomVector(Numel(s), 8), r = RandomVector(Numel(s), 9);
  for (float& v : xh) v += v >= 0 ? 0.1f : -0.1f;  // keep clear of the kink
  Tensor x = Make(be(), s, Layout::kNative, xh), y(be(), s, Layout::kNative),
         dy = Make(be(), s, Layout::kNative, r), dx(be(), s, Layout::kNative);
  ASSERT_OK(be()->ReluForward(x, &y));
  ASSERT_OK(be()->ReluBackward(y, dy, &dx));
  auto loss = [&] {
    Upload(be(), xh, &x);
    EXPECT_OK(be()->ReluForward(x, &y));
    return Dot(Download(be(), y), r);
  };
  CheckGrad("relu dx", &xh, Download(be(), dx), loss);

  // Add with and without the ReLU: values.
  std::vector<float> ah = RandomVector(Numel(s), 10), bh = RandomVector(Numel(s), 11);
  Tensor a = Make(be(), s, Layout::kNative, ah), b = Make(be(), s, Layout::kNative, bh);
  for (bool relu : {false, true}) {
    ASSERT_OK(be()->Add(a, b, &y, relu));
    std::vector<float> yh = Download(be(), y);
    for (size_t i = 0; i < yh.size(); ++i) {
      const float want = relu ? std::max(0.f, ah[i] + bh[i]) : ah[i] + bh[i];
      ASSERT_NEAR(yh[i], want, 1e-6) << i;
    }
  }
}

// ---- pooling
TEST_P(OpsTest, MaxPoolGradients) {
  const Shape xs{2, 16, 7, 7};
  PoolParams p;  // 3x3 s2 p1, the ResNet stem
  const Shape ys{2, 16, p.OutSize(7), p.OutSize(7)};
  // Distinct values spaced well apart so a +-h step never changes the argmax.
  std::vector<float> xh(Numel(xs));
  for (size_t i = 0; i < xh.size(); ++i) xh[i] = static_cast<float>((i * 7919) % xh.size()) * 0.05f;
  std::vector<float> r = RandomVector(Numel(ys), 12);
  Tensor x = Make(be(), xs, Layout::kNative, xh), y(be(), ys, Layout::kNative),
         dy = Make(be(), ys, Layout::kNative, r), dx(be(), xs, Layout::kNative);
  ASSERT_OK(be()->MaxPool2dForward(p, x, &y));
  ASSERT_OK(be()->MaxPool2dBackward(p, x, y, dy, &dx));
  auto loss = [&] {
    Upload(be(), xh, &x);
    EXPECT_OK(be()->MaxPool2dForward(p, x, &y));
    return Dot(Download(be(), y), r);
  };
  GradCheckOptions o;
  o.samples = 200;
  CheckGrad("maxpool dx", &xh, Download(be(), dx), loss, o);
}

TEST_P(OpsTest, GlobalAvgPoolGradients) {
  const Shape xs{2, 16, 3, 3}, ys{2, 16};
  std::vector<float> xh = RandomVector(Numel(xs), 13), r = RandomVector(Numel(ys), 14);
  Tensor x = Make(be(), xs, Layout::kNative, xh), y(be(), ys),
         dy = Make(be(), ys, Layout::kNCHW, r), dx(be(), xs, Layout::kNative);
  ASSERT_OK(be()->GlobalAvgPoolForward(x, &y));
  std::vector<float> yh = Download(be(), y);
  double want = 0;
  for (int i = 0; i < 9; ++i) want += xh[i];
  EXPECT_NEAR(yh[0], want / 9, 1e-5);
  ASSERT_OK(be()->GlobalAvgPoolBackward(dy, &dx));
  auto loss = [&] {
    Upload(be(), xh, &x);
    EXPECT_OK(be()->GlobalAvgPoolForward(x, &y));
    return Dot(Download(be(), y), r);
  };
  CheckGrad("gap dx", &xh, Download(be(), dx), loss);
}

// ---- fully connected
TEST_P(OpsTest, LinearGradients) {
  const Shape xs{3, 16}, ws{10, 16}, bs{10}, ys{3, 10};
  std::vector<float> xh = RandomVector(Numel(xs), 15), wh = RandomVector(Numel(ws), 16),
                     bh = RandomVector(10, 17), r = RandomVector(Numel(ys), 18);
  Tensor x = Make(be(), xs, Layout::kNCHW, xh), w = Make(be(), ws, Layout::kNCHW, wh),
         b = Make(be(), bs, Layout::kNCHW, bh), y(be(), ys), dy = Make(be(), ys, Layout::kNCHW, r);
  Tensor dx(be(), xs), dw(be(), ws), db(be(), bs);
  ASSERT_OK(be()->LinearForward(x, w, b, &y));
  ASSERT_OK(be()->LinearBackward(x, w, dy, &dx, &dw, &db));
  auto loss = [&] {
    Upload(be(), xh, &x);
    Upload(be(), wh, &w);
    Upload(be(), bh, &b);
    EXPECT_OK(be()->LinearForward(x, w, b, &y));
    return Dot(Download(be(), y), r);
  };
  CheckGrad("fc dx", &xh, Download(be(), dx), loss);
  CheckGrad("fc dw", &wh, Download(be(), dw), loss);
  CheckGrad("fc db", &bh, Download(be(), db), loss);
}

// ---- loss
TEST_P(OpsTest, SoftmaxCrossEntropyGradientAndCounts) {
  const int64_t n = 4, m = 5;
  std::vector<float> zh = RandomVector(n * m, 19, -2.f, 2.f);
  const std::vector<int32_t> labels{0, 3, 4, 1};
  zh[0 * m + 0] = 5.f;  // sample 0 predicted right
  zh[1 * m + 2] = 5.f;  // sample 1 predicted wrong
  Tensor z = Make(be(), {n, m}, Layout::kNCHW, zh), dz(be(), {n, m});
  Tensor lab(be(), {n}, Layout::kNCHW, DataType::kInt32);
  ASSERT_OK(be()->CopyFromHost(labels.data(), &lab));
  for (float eps : {0.f, 0.1f}) {
    double loss_sum = 0;
    int64_t correct = 0;
    ASSERT_OK(be()->SoftmaxCrossEntropy(z, lab, eps, 1.f / n, &dz, &loss_sum, &correct));
    // Hand-computed loss for row 0.
    double lse = 0;
    for (int k = 0; k < m; ++k) lse += std::exp(zh[k]);
    lse = std::log(lse);
    double row0 = 0;
    for (int k = 0; k < m; ++k) row0 -= (eps / m + (k == 0 ? 1 - eps : 0)) * (zh[k] - lse);
    EXPECT_GT(loss_sum, row0);
    auto loss = [&] {
      Upload(be(), zh, &z);
      double s = 0;
      int64_t c = 0;
      EXPECT_OK(be()->SoftmaxCrossEntropy(z, lab, eps, 1.f / n, nullptr, &s, &c));
      return s / n;
    };
    std::vector<float> analytic = Download(be(), dz);
    CheckGrad("xent dlogits", &zh, analytic, loss);
    int64_t c = 0;
    double s = 0;
    ASSERT_OK(be()->SoftmaxCrossEntropy(z, lab, eps, 1.f / n, nullptr, &s, &c));
    EXPECT_EQ(c, correct);
    EXPECT_GE(correct, 1);
    EXPECT_LE(correct, 3);
  }
  // An out-of-range label is an error, not a crash.
  const std::vector<int32_t> bad{0, 9, 0, 0};
  ASSERT_OK(be()->CopyFromHost(bad.data(), &lab));
  double s;
  int64_t c;
  EXPECT_FALSE(be()->SoftmaxCrossEntropy(z, lab, 0.f, 1.f, nullptr, &s, &c).ok());
}

// ---- optimizer against the PyTorch formula, computed by hand
TEST_P(OpsTest, SgdUpdateMatchesFormula) {
  for (bool nesterov : {false, true}) {
    std::vector<float> w{1.f, -2.f, 3.f, 4.f}, g{0.5f, 0.5f, -1.f, 2.f}, m{0.1f, 0.f, 0.f, 1.f};
    Tensor tw = Make(be(), {4}, Layout::kNCHW, w), tg = Make(be(), {4}, Layout::kNCHW, g),
           tm = Make(be(), {4}, Layout::kNCHW, m);
    SgdParams p;
    p.lr = 0.1f;
    p.momentum = 0.9f;
    p.weight_decay = 0.01f;
    p.nesterov = nesterov;
    ASSERT_OK(be()->SgdUpdate(p, &tw, tg, &tm, 1, 2));  // only elements 1 and 2
    std::vector<float> w2 = Download(be(), tw), m2 = Download(be(), tm);
    EXPECT_EQ(w2[0], w[0]);
    EXPECT_EQ(w2[3], w[3]);
    for (int i = 1; i <= 2; ++i) {
      const double gi = g[i] + 0.01 * w[i];
      const double buf = 0.9 * m[i] + gi;
      const double step = nesterov ? gi + 0.9 * buf : buf;
      EXPECT_NEAR(m2[i], buf, 1e-6);
      EXPECT_NEAR(w2[i], w[i] - 0.1 * step, 1e-6);
    }
    EXPECT_FALSE(be()->SgdUpdate(p, &tw, tg, &tm, 2, 5).ok());
  }
}

TEST_P(OpsTest, FillScaleCopy) {
  const Shape s{2, 16, 2, 2};
  Tensor t(be(), s, Layout::kNative);
  ASSERT_OK(be()->Fill(&t, 3.f));
  for (float v : Download(be(), t)) ASSERT_EQ(v, 3.f);
  ASSERT_OK(be()->Scale(&t, 0.5f));
  for (float v : Download(be(), t)) ASSERT_EQ(v, 1.5f);
  std::vector<float> h = RandomVector(Numel(s), 20);
  Tensor a = Make(be(), s, Layout::kNative, h), b(be(), s, Layout::kNHWC);
  ASSERT_OK(be()->Copy(a, &b));
  EXPECT_EQ(Download(be(), b), h);
}

INSTANTIATE_TEST_SUITE_P(Backends, OpsTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace edl::resnet50::test
