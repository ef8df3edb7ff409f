// The distillation loss (resnet50/distill_loss.h): finite-difference gradient checks (tolerances
// in grad_check.h) with full and top-k teacher rows and fallback samples, agreement with the
// backend's cross-entropy for A = 1, a zero soft term when teacher and student agree, and the
// errors for bad teacher rows and parameters.
#include "resnet50/distill_loss.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "resnet50/backend.h"
#include "tests/resnet50/grad_check.h"
#include "tests/testutil.h"

namespace edl::resnet50::test {
namespace {

constexpr int64_t kN = 6, kM = 10;

struct Case {
  std::vector<float> z, teacher;
  std::vector<int32_t> labels;
  std::vector<uint8_t> has;
};

Case MakeCase(uint32_t seed) {
  Case c;
  c.z = RandomVector(kN * kM, seed, -3.f, 3.f);
  c.teacher = RandomVector(kN * kM, seed + 1, -4.f, 4.f);
  for (int64_t i = 0; i < kN; ++i) c.labels.push_back(static_cast<int32_t>((i * 7 + seed) % kM));
  c.has = {1, 1, 0, 1, 0, 1};  // rows 2 and 4: fallback (labels only)
  return c;
}

double Loss(const DistillLossParams& p, const Case& c, std::vector<float>* dz = nullptr) {
  std::vector<float> scratch(kN * kM);
  double loss = 0;
  int64_t correct = 0;
  EXPECT_OK(DistillLoss(p, c.z.data(), c.labels.data(), c.teacher.data(), c.has.data(), kN, kM, 1.f,
                        dz ? dz->data() : scratch.data(), &loss, &correct));
  return loss;
}

void CheckCase(const DistillLossParams& p, Case c) {
  std::vector<float> dz(kN * kM);
  Loss(p, c, &dz);
  GradCheckOptions o;
  o.samples = kN * kM;  // every coordinate
  o.h = 1e-3f;          // the loss is evaluated in double: a small step is exact enough
  CheckGrad(
      "dz", &c.z, dz, [&] { return Loss(p, c); }, o);
}

TEST(DistillLossTest, GradientFullTeacherRows) {
  for (float t : {1.f, 4.f}) {
    for (float a : {0.f, 0.3f, 1.f}) {
      SCOPED_TRACE(testing::Message() << "T=" << t << " A=" << a);
      DistillLossParams p;
      p.temperature = t;
      p.alpha = a;
      CheckCase(p, MakeCase(3));
    }
  }
}

TEST(DistillLossTest, GradientTopKTeacherRowsAndSmoothing) {
  Case c = MakeCase(11);
  // Keep 3 classes per teacher row; the rest were not sent.
  for (int64_t i = 0; i < kN; ++i) {
    for (int64_t k = 3; k < kM; ++k)
      c.teacher[i * kM + (k + i) % kM] = -std::numeric_limits<float>::infinity();
  }
  DistillLossParams p;
  p.temperature = 2.f;
  p.alpha = 0.5f;
  p.label_smoothing = 0.1f;
  CheckCase(p, c);
  EXPECT_TRUE(std::isfinite(Loss(p, c)));
}

TEST(DistillLossTest, AlphaOneIsTheBackendCrossEntropy) {
  auto be = CreateBackend("cpu", BackendOptions{});
  ASSERT_TRUE(be.ok()) << be.status().ToString();
  Case c = MakeCase(5);
  Tensor z(be.value().get(), {kN, kM}),
      labels(be.value().get(), {kN}, Layout::kNCHW, DataType::kInt32);
  Tensor dz_ref(be.value().get(), {kN, kM});
  ASSERT_OK(be.value()->CopyFromHost(c.z.data(), &z));
  ASSERT_OK(be.value()->CopyFromHost(c.labels.data(), &labels));
  double ref_loss = 0;
  int64_t ref_correct = 0;
  ASSERT_OK(
      be.value()->SoftmaxCrossEntropy(z, labels, 0.f, 0.5f, &dz_ref, &ref_loss, &ref_correct));
  DistillLossParams p;
  p.alpha = 1.f;
  std::vector<float> dz(kN * kM);
  double loss = 0;
  int64_t correct = 0;
  ASSERT_OK(DistillLoss(p, c.z.data(), c.labels.data(), c.teacher.data(), c.has.data(), kN, kM,
                        0.5f, dz.data(), &loss, &correct));
  EXPECT_NEAR(loss, ref_loss, 1e-4 * std::fabs(ref_loss));
  EXPECT_EQ(correct, ref_correct);
  std::vector<float> ref(kN * kM);
  ASSERT_OK(be.value()->CopyToHost(dz_ref, ref.data()));
  for (int64_t i = 0; i < kN * kM; ++i) EXPECT_NEAR(dz[i], ref[i], 1e-6) << i;
}

TEST(DistillLossTest, SoftTermVanishesWhenTeacherEqualsStudent) {
  Case c = MakeCase(7);
  c.teacher = c.z;
  DistillLossParams soft;
  soft.alpha = 0.f;
  soft.temperature = 3.f;
  std::vector<float> dz(kN * kM);
  const double loss = Loss(soft, c, &dz);
  // A = 0 and identical rows: every row with a teacher adds 0 loss and 0 gradient; only the
  // fallback rows (2, 4) keep their label loss.
  {
    std::vector<float> dz_all(kN * kM);
    Case only = c;
    only.has.assign(kN, 1);
    EXPECT_NEAR(Loss(soft, only, &dz_all), 0.0, 1e-9);
    for (float g : dz_all) EXPECT_NEAR(g, 0.f, 1e-6);
  }
  double expect = 0;
  for (int64_t i : {2, 4}) {
    double mx = c.z[i * kM];
    for (int64_t k = 1; k < kM; ++k) mx = std::max<double>(mx, c.z[i * kM + k]);
    double s = 0;
    for (int64_t k = 0; k < kM; ++k) s += std::exp(c.z[i * kM + k] - mx);
    expect += mx + std::log(s) - c.z[i * kM + c.labels[i]];
  }
  EXPECT_NEAR(loss, expect, 1e-9);
}

TEST(DistillLossTest, BadInputIsAnErrorNamingTheProblem) {
  Case c = MakeCase(9);
  std::vector<float> dz(kN * kM);
  double loss = 0;
  int64_t correct = 0;
  DistillLossParams p;
  c.teacher[1 * kM + 4] = std::numeric_limits<float>::quiet_NaN();
  Status s = DistillLoss(p, c.z.data(), c.labels.data(), c.teacher.data(), c.has.data(), kN, kM,
                         1.f, dz.data(), &loss, &correct);
  EXPECT_TRUE(s.code() == Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.ToString().find("teacher's logits of row 1"), std::string::npos) << s.ToString();
  c = MakeCase(9);
  for (int64_t k = 0; k < kM; ++k) c.teacher[k] = -std::numeric_limits<float>::infinity();
  s = DistillLoss(p, c.z.data(), c.labels.data(), c.teacher.data(), c.has.data(), kN, kM, 1.f,
                  dz.data(), &loss, &correct);
  EXPECT_TRUE(s.code() == Status::Code::kInvalidArgument) << s.ToString();
  p.temperature = 0.f;
  EXPECT_NE(ValidateDistillLossParams(p).ToString().find("--distill_temperature"),
            std::string::npos);
  p.temperature = 1.f;
  p.alpha = 1.5f;
  EXPECT_NE(ValidateDistillLossParams(p).ToString().find("--distill_alpha"), std::string::npos);
}

}  // namespace
}  // namespace edl::resnet50::test
