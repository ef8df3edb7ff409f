// Whole-model gradient check of a small ResNet, the ImageNet-style models' shapes, and the
// Trainer's state API (stable names, fingerprint, state transfer makes two trainers identical).
#include <cmath>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "resnet50/model.h"
#include "resnet50/trainer.h"
#include "tests/resnet50/grad_check.h"
#include "tests/testutil.h"

namespace edl::resnet50::test {
namespace {

std::unique_ptr<Backend> Cpu() {
  BackendOptions o;
  o.threads = 2;
  auto be = CreateBackend("cpu", o);
  EXPECT_OK(be.status());
  return std::move(be.value());
}

// Mean cross-entropy of `model` on (x, labels) in training mode; *dlogits (if given) receives the
// gradient of the mean loss.
double Loss(Backend* be, Model* model, const Tensor& x, const Tensor& labels, Tensor* dlogits) {
  const Tensor* logits = nullptr;
  EXPECT_OK(model->Forward(x, true, &logits));
  double sum = 0;
  int64_t correct = 0;
  const float n = static_cast<float>(x.dim(0));
  EXPECT_OK(be->SoftmaxCrossEntropy(*logits, labels, 0.1f, 1.f / n, dlogits, &sum, &correct));
  return sum / n;
}

// Finite differences (fp32 model, h = 1e-3, |g - num| <= 1e-3 + 5e-2 * max(|g|, |num|)) on
// parameters of every layer type of a whole ResNet-20 (1x8x8 images, batch 8): stem conv, BN
// gamma/beta, block convs, projection shortcut conv/BN, fc weight and bias. A stem parameter moves
// every activation of the network, so its +-h step crosses some of the ~10^4 ReLU kinks and the
// finite difference itself is off by up to ~10% there (it changes with h; seen: 34/36 within
// tolerance, the misses all in conv1/bn1); up to 2 such misses are allowed. A wrong backward (a
// missing shortcut gradient, a wrong sign or scale) fails most of the 36 coordinates.
TEST(ModelTest, WholeResNet20GradientCheck) {
  auto be = Cpu();
  ModelConfig mc;
  mc.name = "resnet20";
  mc.in_channels = 1;
  const int64_t size = 8;
  mc.image_size = size;
  mc.seed = 3;
  auto made = Model::Create(be.get(), mc);
  ASSERT_OK(made.status());
  Model* model = made.value().get();
  const int64_t n = 8;
  Tensor x = Make(be.get(), {n, 1, size, size}, Layout::kNCHW, RandomVector(n * size * size, 21));
  Tensor labels(be.get(), {n}, Layout::kNCHW, DataType::kInt32);
  const std::vector<int32_t> lh{1, 7, 3, 3, 0, 9, 2, 5};
  ASSERT_OK(be->CopyFromHost(lh.data(), &labels));
  Tensor dlogits(be.get(), {n, 10});
  Loss(be.get(), model, x, labels, &dlogits);
  ASSERT_OK(model->Backward(dlogits));
  std::vector<float> grads(model->num_params()), params(model->num_params());
  ASSERT_OK(be->CopyToHost(Tensor::View(be.get(), model->grads().raw(), {model->num_params()}),
                           grads.data()));
  ASSERT_OK(be->CopyToHost(model->params(), params.data()));

  int checked = 0, passed = 0;
  for (const Model::ParamInfo& p : model->param_info()) {
    const bool pick =
        p.name == "conv1.weight" || p.name == "bn1.weight" || p.name == "layer1.0.conv2.weight" ||
        p.name == "layer1.2.bn2.bias" || p.name == "layer2.0.downsample.0.weight" ||
        p.name == "layer2.0.downsample.1.weight" || p.name == "layer3.2.conv1.weight" ||
        p.name == "fc.weight" || p.name == "fc.bias";
    if (!pick) continue;
    int64_t count = 1;
    for (int64_t d : p.shape) count *= d;
    for (int k = 0; k < 4; ++k) {
      const int64_t i = p.offset + (k * 7919) % count;
      const float saved = params[i];
      const float h = 1e-3f;
      params[i] = saved + h;
      ASSERT_OK(be->CopyFromHost(params.data(), &model->params()));
      const double lp = Loss(be.get(), model, x, labels, nullptr);
      params[i] = saved - h;
      ASSERT_OK(be->CopyFromHost(params.data(), &model->params()));
      const double lm = Loss(be.get(), model, x, labels, nullptr);
      params[i] = saved;
      const double num = (lp - lm) / (2 * h);
      const double err = std::fabs(num - grads[i]);
      const bool ok = err <= 1e-3 + 5e-2 * std::max(std::fabs(num), std::fabs(double{grads[i]}));
      ++checked;
      passed += ok;
      if (!ok) {
        std::cout << "  mismatch " << p.name << "[" << i - p.offset << "]: analytic " << grads[i]
                  << " numerical " << num << "\n";
      }
    }
  }
  ASSERT_OK(be->CopyFromHost(params.data(), &model->params()));
  std::cout << "  whole-model grad check: " << passed << "/" << checked << " within tolerance\n";
  EXPECT_EQ(checked, 36);
  EXPECT_GE(passed, checked - 2);
}

// The ImageNet-style models build with the right parameter counts (torchvision's, with our
// 10-class head) and run forward+backward at a small size.
TEST(ModelTest, ImageNetModelsShapes) {
  auto be = Cpu();
  struct Case {
    const char* name;
    int64_t params;  // torchvision parameter count with a 10-class fc
  } cases[] = {{"resnet18", 11181642}, {"resnet50", 23528522}};
  for (const Case& c : cases) {
    ModelConfig mc;
    mc.name = c.name;
    mc.in_channels = 3;
    mc.image_size = 64;
    auto made = Model::Create(be.get(), mc);
    ASSERT_OK(made.status());
    EXPECT_EQ(made.value()->num_params(), c.params) << c.name;
    Tensor x = Make(be.get(), {2, 3, 64, 64}, Layout::kNCHW, RandomVector(2 * 3 * 64 * 64, 22));
    Tensor labels(be.get(), {2}, Layout::kNCHW, DataType::kInt32);
    const std::vector<int32_t> lh{0, 1};
    ASSERT_OK(be->CopyFromHost(lh.data(), &labels));
    Tensor dlogits(be.get(), {2, 10});
    const double loss = Loss(be.get(), made.value().get(), x, labels, &dlogits);
    EXPECT_TRUE(std::isfinite(loss));
    ASSERT_OK(made.value()->Backward(dlogits));
  }
  ModelConfig bad;
  bad.name = "resnet50";
  bad.in_channels = 3;
  bad.image_size = 28;
  Status s = Model::Create(be.get(), bad).status();
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("--image_size"), std::string::npos) << s.ToString();
  bad.name = "resnet7";
  EXPECT_NE(Model::Create(be.get(), bad).status().message().find("--model"), std::string::npos);
}

std::unique_ptr<Trainer> MakeTrainer(uint64_t seed) {
  TrainerOptions o;
  o.threads = 2;
  o.seed = seed;
  o.model.name = "resnet20";
  auto t = Trainer::Create(o, MakeSyntheticDataset(64, 1, 8, 10, 5),
                           MakeSyntheticDataset(16, 1, 8, 10, 6));
  EXPECT_OK(t.status());
  return std::move(t.value());
}

TEST(TrainerTest, StateTensorsFingerprintAndTransfer) {
  auto a = MakeTrainer(1), b = MakeTrainer(2);
  std::vector<runtime::StateTensor> sa = a->StateTensors(), sb = b->StateTensors();
  ASSERT_EQ(sa.size(), sb.size());
  std::set<std::string> names;
  for (const auto& t : sa) names.insert(t.name);
  EXPECT_EQ(names.size(), sa.size()) << "state tensor names must be unique";
  for (const char* want : {"conv1.weight", "bn1.running_mean", "layer3.2.bn2.running_var",
                           "layer2.0.downsample.0.weight", "fc.bias", "momentum/fc.weight"}) {
    EXPECT_TRUE(names.count(want)) << want;
  }
  EXPECT_EQ(a->Fingerprint(), b->Fingerprint());
  EXPECT_NE(a->Fingerprint().find("resnet20"), std::string::npos);
  EXPECT_LT(a->Fingerprint().size(), 48u) << a->Fingerprint();  // short, for `edl ckpt ls`
  EXPECT_NE(a->StateLayout().find("layer3.2.bn2.running_var[64]"), std::string::npos);
  {
    TrainerOptions o;
    o.threads = 2;
    o.model.name = "resnet20";
    auto other = Trainer::Create(o, MakeSyntheticDataset(64, 1, 8, 7, 5), nullptr);
    ASSERT_OK(other.status());
    EXPECT_NE(other.value()->Fingerprint(), a->Fingerprint());  // another fc shape
  }
  size_t count = 0;
  float* grads = a->GradientBuffer(&count);
  EXPECT_EQ(static_cast<int64_t>(count), a->model()->num_params());
  ASSERT_NE(grads, nullptr);

  // Train `a` two steps (momentum and running stats become non-trivial), then copy every state
  // tensor to `b`: both must then produce identical losses and gradients.
  const std::vector<int64_t> idx{0, 1, 2, 3, 4, 5, 6, 7};
  runtime::StepStats st;
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(a->ForwardBackward(idx, &st));
    ASSERT_OK(a->ApplyUpdate(0.05));
  }
  for (size_t i = 0; i < sa.size(); ++i) {
    std::vector<char> host(sa[i].bytes);
    ASSERT_OK(a->CopyToHost(sa[i], host.data()));
    ASSERT_OK(b->CopyFromHost(sb[i], host.data()));
  }
  runtime::StepStats s1, s2;
  ASSERT_OK(a->ForwardBackward(idx, &s1));
  ASSERT_OK(b->ForwardBackward(idx, &s2));
  EXPECT_EQ(s1.loss_sum, s2.loss_sum);
  size_t cb = 0;
  float* gb = b->GradientBuffer(&cb);
  EXPECT_EQ(std::vector<float>(grads, grads + count), std::vector<float>(gb, gb + cb));
  ASSERT_OK(a->ApplyUpdate(0.05));
  ASSERT_OK(b->ApplyUpdate(0.05));
  ASSERT_OK(a->Evaluate({0, 1, 2, 3}, &s1));
  ASSERT_OK(b->Evaluate({0, 1, 2, 3}, &s2));
  EXPECT_EQ(s1.loss_sum, s2.loss_sum);

  // ScaleGradients touches the gradients, not the in-band slots.
  const float g0 = grads[0];
  grads[count] = 7.f;
  ASSERT_OK(a->ScaleGradients(0.5f));
  EXPECT_EQ(grads[0], g0 * 0.5f);
  EXPECT_EQ(grads[count], 7.f);
}

}  // namespace
}  // namespace edl::resnet50::test
