// CUDA-vs-CPU parity: the same initial weights and batch through (a) a whole ResNet-20 training
// step (forward, loss, backward, SGD update) and (b) a ResNet-50 bottleneck block with a projection
// shortcut (1x1 -> 3x3 stride 2 -> 1x1, BN+ReLU, residual add) built from backend ops, on the CPU
// backend (oneDNN, fp32) and the CUDA backend in each precision. Compared: the loss, every
// parameter gradient, the block's input gradient, the BN running statistics and the updated
// weights, each printed as its max relative difference
//     max_i |cuda_i - cpu_i| / max(max_i |cpu_i|, 1e-6)
// (relative to the tensor's scale, so tiny entries do not dominate).
//
// Tolerances. fp32 (measured on an H100 by `make gpu-check`: ResNet-20 gradients 1.7e-3, block
// 5.6e-7, loss 2.7e-10):
//   fp32  block 2e-3, ResNet-20 5e-3 (cuDNN FMA-only algorithms, e.g. Winograd, reorder sums; BN
//         over small batches amplifies that through depth), loss 1e-4 relative.
// bf16 and fp16 are not judged per element: at initialisation, with a batch of 8 and BN in every
// block, reduced-precision gradients differ from fp32 ones by tens of percent per tensor for any
// correct implementation. PyTorch's own bf16 autocast against its fp32 on this ResNet-20 and batch
// shape (tests/resnet50/bf16_reference.py, 5 seeds): per-tensor max relative difference median
// 0.31-0.34, max 0.60-1.19; whole-model gradient cosine 0.945-0.952, relative L2 0.31-0.33. The
// CUDA backend in bf16 measured per tensor at most 0.46 (the H100 run that failed the old 0.15
// bound). So for bf16/fp16 the gradients, the block's dx and the updated weights are judged as
// whole vectors by cosine similarity (>= 0.9: a missing or mis-signed layer gradient falls below
// it), the loss and the BN running statistics per element as before:
//   bf16  loss 2e-2, BN statistics 1.5e-1 (8-bit mantissa activations and conv operands).
//   fp16  loss 1e-2, BN statistics 1e-1 (10-bit mantissa, loss-scaled gradients); the block test
//         is not instantiated for fp16 (it feeds dy directly, without the loss op that applies
//         the loss scale).
// The cosine criterion has not run on a GPU yet (written after the device time was spent).
// Skips, saying why, where no GPU is visible (and fails where the plugin does not load).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "resnet50/backend.h"
#include "resnet50/model.h"
#include "tests/resnet50/grad_check.h"
#include "tests/testutil.h"

namespace edl::resnet50::test {
namespace {

struct Tolerance {
  const char* precision;
  double block, model, loss;
  double min_cosine;  // 0: judge gradients per element (block / model); else as whole vectors
};

const Tolerance kTolerances[] = {
    {"fp32", 2e-3, 5e-3, 1e-4, 0},
    {"bf16", 5e-2, 1.5e-1, 2e-2, 0.9},
    {"fp16", 2e-2, 1e-1, 1e-2, 0.9},
};

double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0;
}

// Reduced precision: `cuda` points where `cpu` does, as a whole vector.
void ExpectAligned(const std::string& what, const std::vector<float>& cpu,
                   const std::vector<float>& gpu, const Tolerance& tol) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  const double c = Cosine(cpu, gpu);
  std::cout << "  [" << tol.precision << "] " << what << ": cosine " << c << " (at least "
            << tol.min_cosine << ")\n";
  EXPECT_GE(c, tol.min_cosine) << what << ": cosine similarity " << c;
}

double MaxRelDiff(const std::vector<float>& cpu, const std::vector<float>& gpu) {
  double scale = 1e-6, diff = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(cpu[i])));
    diff = std::max(diff, std::fabs(static_cast<double>(cpu[i]) - gpu[i]));
  }
  return diff / scale;
}

// Expects cpu ~ gpu within tol and prints the figure; returns the difference.
double ExpectClose(const std::string& what, const std::vector<float>& cpu,
                   const std::vector<float>& gpu, double tol) {
  EXPECT_EQ(cpu.size(), gpu.size()) << what;
  if (cpu.size() != gpu.size()) return 1e9;
  const double d = MaxRelDiff(cpu, gpu);
  EXPECT_LE(d, tol) << what << ": max relative difference " << d << " > " << tol;
  return d;
}

std::unique_ptr<Backend> MakeBackend(const std::string& device, const std::string& precision,
                                     std::string* skip) {
  BackendOptions o;
  o.threads = 2;
  o.precision = precision;
  auto be = CreateBackend(device, o);
  if (!be.ok()) {
    // Only "no GPU" skips: a plugin that does not load in this CUDA build is a failure.
    EXPECT_EQ(be.status().code(), Status::Code::kUnavailable) << be.status().ToString();
    *skip = device + " backend unavailable: " + be.status().ToString();
    return nullptr;
  }
  return std::move(be.value());
}

std::vector<float> Host(Backend* be, const Tensor& t) {  // flat fp32 tensor -> host
  std::vector<float> v(t.bytes() / sizeof(float));
  EXPECT_OK(be->CopyToHost(t, v.data()));
  return v;
}

class CudaParityTest : public ::testing::TestWithParam<Tolerance> {
 protected:
  void SetUp() override {
    std::string why;
    cpu_ = MakeBackend("cpu", "fp32", &why);
    ASSERT_NE(cpu_, nullptr) << why;
    cuda_ = MakeBackend("cuda", GetParam().precision, &why);
    // After a failure recorded by MakeBackend (a plugin that does not load), gtest reports the
    // test failed even though it stops here; only "no GPU" is a skip.
    if (cuda_ == nullptr) GTEST_SKIP() << why;
  }
  std::unique_ptr<Backend> cpu_, cuda_;
};

// ---------------------------------------------------------------------------------------------
// (a) ResNet-20: one whole training step.

struct StepResult {
  double loss = 0;
  std::vector<float> grads, params, stats;
};

StepResult ResNet20Step(Backend* be, const std::vector<float>& images,
                        const std::vector<int32_t>& labels, int64_t n, int64_t size) {
  StepResult r;
  ModelConfig mc;
  mc.name = "resnet20";
  mc.in_channels = 3;
  mc.image_size = static_cast<int>(size);
  mc.seed = 11;
  auto made = Model::Create(be, mc);
  EXPECT_OK(made.status());
  if (!made.ok()) return r;
  Model* model = made.value().get();
  Tensor x(be, {n, 3, size, size}), lab(be, {n}, Layout::kNCHW, DataType::kInt32),
      dlogits(be, {n, 10}), momentum(be, {model->num_params()});
  EXPECT_OK(be->CopyFromHost(images.data(), &x));
  EXPECT_OK(be->CopyFromHost(labels.data(), &lab));
  EXPECT_OK(be->Fill(&momentum, 0.f));
  const Tensor* logits = nullptr;
  EXPECT_OK(model->Forward(x, true, &logits));
  int64_t correct = 0;
  EXPECT_OK(be->SoftmaxCrossEntropy(*logits, lab, 0.1f, 1.f / n, &dlogits, &r.loss, &correct));
  EXPECT_OK(model->Backward(dlogits));
  r.grads = Host(be, model->grads());
  r.grads.resize(model->num_params());
  SgdParams sp;
  sp.lr = 0.1f;
  sp.weight_decay = 5e-4f;
  EXPECT_OK(
      be->SgdUpdate(sp, &model->params(), model->grads(), &momentum, 0, model->decay_count()));
  sp.weight_decay = 0.f;
  EXPECT_OK(be->SgdUpdate(sp, &model->params(), model->grads(), &momentum, model->decay_count(),
                          model->num_params() - model->decay_count()));
  r.params = Host(be, model->params());
  for (const Model::BufferInfo& b : model->buffers()) {
    std::vector<float> v = Host(be, *b.tensor);
    r.stats.insert(r.stats.end(), v.begin(), v.end());
  }
  // Parameter names for the per-tensor report come from a CPU model in the test body.
  return r;
}

TEST_P(CudaParityTest, ResNet20TrainingStep) {
  const Tolerance tol = GetParam();
  const int64_t n = 8, size = 32;
  const std::vector<float> images = RandomVector(n * 3 * size * size, 41);
  const std::vector<int32_t> labels{3, 1, 4, 1, 5, 9, 2, 6};
  StepResult a = ResNet20Step(cpu_.get(), images, labels, n, size);
  StepResult b = ResNet20Step(cuda_.get(), images, labels, n, size);
  ASSERT_FALSE(a.grads.empty());
  ASSERT_FALSE(b.grads.empty());
  const double loss_diff = std::fabs(a.loss - b.loss) / std::max(1e-6, std::fabs(a.loss));
  std::cout << "  [" << tol.precision << "] ResNet-20 loss cpu " << a.loss / n << " cuda "
            << b.loss / n << " rel diff " << loss_diff << "\n";
  EXPECT_LE(loss_diff, tol.loss);

  ModelConfig mc;
  mc.name = "resnet20";
  mc.in_channels = 3;
  mc.image_size = static_cast<int>(size);
  auto names = Model::Create(cpu_.get(), mc);
  ASSERT_OK(names.status());
  double worst_grad = 0, worst_param = 0;
  std::string worst_name;
  for (const Model::ParamInfo& p : names.value()->param_info()) {
    const int64_t count = Numel(p.shape);
    auto slice = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + p.offset, v.begin() + p.offset + count);
    };
    const double g = tol.min_cosine > 0
                         ? MaxRelDiff(slice(a.grads), slice(b.grads))
                         : ExpectClose("grad " + p.name, slice(a.grads), slice(b.grads), tol.model);
    const double w = tol.min_cosine > 0 ? MaxRelDiff(slice(a.params), slice(b.params))
                                        : ExpectClose("updated " + p.name, slice(a.params),
                                                      slice(b.params), tol.model);
    if (g > worst_grad) worst_name = p.name;
    worst_grad = std::max(worst_grad, g);
    worst_param = std::max(worst_param, w);
  }
  if (tol.min_cosine > 0) {
    ExpectAligned("ResNet-20 gradients", a.grads, b.grads, tol);
    ExpectAligned("ResNet-20 updated weights", a.params, b.params, tol);
  }
  const double stats = ExpectClose("BN running statistics", a.stats, b.stats, tol.model);
  std::cout << "  [" << tol.precision << "] ResNet-20 max rel diff: gradients " << worst_grad
            << " (" << worst_name << "), updated weights " << worst_param << ", BN running stats "
            << stats << " (tolerance " << tol.model << ")\n";
}

// ---------------------------------------------------------------------------------------------
// (b) ResNet-50 bottleneck block with projection shortcut, from backend ops.

struct BlockShape {
  int64_t n = 4, cin = 64, width = 32, cout = 128, size = 8;
  int stride = 2;
};

struct BlockResult {
  double loss = 0;
  std::vector<float> grads, params, dx, stats;
};

// Parameters in one flat buffer: w1 [W,Cin,1,1], w2 [W,W,3,3], w3 [Cout,W,1,1], wd [Cout,Cin,1,1],
// then gamma/beta of bn1 [W], bn2 [W], bn3 [Cout], bnd [Cout].
struct BlockLayout {
  std::vector<Shape> shapes;
  std::vector<int64_t> offsets;
  int64_t total = 0;
  explicit BlockLayout(const BlockShape& s) {
    shapes = {{s.width, s.cin, 1, 1},
              {s.width, s.width, 3, 3},
              {s.cout, s.width, 1, 1},
              {s.cout, s.cin, 1, 1},
              {s.width},
              {s.width},
              {s.width},
              {s.width},
              {s.cout},
              {s.cout},
              {s.cout},
              {s.cout}};
    for (const Shape& sh : shapes) {
      offsets.push_back(total);
      total += Numel(sh);
    }
  }
};

BlockResult RunBlock(Backend* be, const BlockShape& s, const std::vector<float>& init,
                     const std::vector<float>& xh, const std::vector<float>& rh) {
  BlockResult r;
  const BlockLayout lay(s);
  const Layout nat = Layout::kNative;
  Tensor flat(be, {lay.total}), grads(be, {lay.total}), mom(be, {lay.total});
  EXPECT_OK(be->CopyFromHost(init.data(), &flat));
  EXPECT_OK(be->Fill(&grads, 0.f));
  EXPECT_OK(be->Fill(&mom, 0.f));
  std::vector<Tensor> p, g;
  for (size_t i = 0; i < lay.shapes.size(); ++i) {
    p.push_back(Tensor::View(be, flat.data() + lay.offsets[i], lay.shapes[i]));
    g.push_back(Tensor::View(be, grads.data() + lay.offsets[i], lay.shapes[i]));
  }
  const int64_t o = Conv2dParams{3, s.stride, 1}.OutSize(s.size);
  const Shape in{s.n, s.cin, s.size, s.size}, mid1{s.n, s.width, s.size, s.size},
      mid2{s.n, s.width, o, o}, out{s.n, s.cout, o, o};
  const Conv2dParams c1{1, 1, 0}, c2{3, s.stride, 1}, c3{1, 1, 0}, cd{1, s.stride, 0};
  Tensor x = Make(be, in, nat, xh);
  Tensor h1(be, mid1, nat), a1(be, mid1, nat), h2(be, mid2, nat), a2(be, mid2, nat),
      h3(be, out, nat), a3(be, out, nat), hd(be, out, nat), ad(be, out, nat), y(be, out, nat);
  struct Bn {
    Tensor mean, invstd, rm, rv;
  };
  std::vector<Bn> bn;
  for (int64_t c : {s.width, s.width, s.cout, s.cout}) {
    Bn b{Tensor(be, {c}), Tensor(be, {c}), Tensor(be, {c}), Tensor(be, {c})};
    EXPECT_OK(be->Fill(&b.rm, 0.f));
    EXPECT_OK(be->Fill(&b.rv, 1.f));
    bn.push_back(std::move(b));
  }
  BatchNormParams relu_bn, plain_bn;
  relu_bn.fuse_relu = true;
  auto fwd_bn = [&](int i, const BatchNormParams& bp, const Tensor& h, Tensor* a) {
    EXPECT_OK(be->BatchNormForwardTraining(bp, h, p[4 + 2 * i], p[5 + 2 * i], a, &bn[i].mean,
                                           &bn[i].invstd, &bn[i].rm, &bn[i].rv));
  };
  // Forward.
  EXPECT_OK(be->Conv2dForward(c1, x, p[0], &h1));
  fwd_bn(0, relu_bn, h1, &a1);
  EXPECT_OK(be->Conv2dForward(c2, a1, p[1], &h2));
  fwd_bn(1, relu_bn, h2, &a2);
  EXPECT_OK(be->Conv2dForward(c3, a2, p[2], &h3));
  fwd_bn(2, plain_bn, h3, &a3);
  EXPECT_OK(be->Conv2dForward(cd, x, p[3], &hd));
  fwd_bn(3, plain_bn, hd, &ad);
  EXPECT_OK(be->Add(a3, ad, &y, /*relu=*/true));
  r.loss = Dot(Download(be, y), rh);  // L = sum(y .* R)
  // Backward.
  Tensor dy = Make(be, out, nat, rh);
  Tensor dsum(be, out, nat), dh3(be, out, nat), dhd(be, out, nat), da2(be, mid2, nat),
      dh2(be, mid2, nat), da1(be, mid1, nat), dh1(be, mid1, nat), dx1(be, in, nat),
      dxd(be, in, nat), dx(be, in, nat);
  auto bwd_bn = [&](int i, const BatchNormParams& bp, const Tensor& h, const Tensor& d,
                    const Tensor* a, Tensor* dh) {
    EXPECT_OK(be->BatchNormBackward(bp, h, d, a, p[4 + 2 * i], bn[i].mean, bn[i].invstd, dh,
                                    &g[4 + 2 * i], &g[5 + 2 * i]));
  };
  EXPECT_OK(be->ReluBackward(y, dy, &dsum));
  bwd_bn(2, plain_bn, h3, dsum, nullptr, &dh3);
  EXPECT_OK(be->Conv2dBackwardFilter(c3, a2, dh3, &g[2]));
  EXPECT_OK(be->Conv2dBackwardData(c3, dh3, p[2], &da2));
  bwd_bn(1, relu_bn, h2, da2, &a2, &dh2);
  EXPECT_OK(be->Conv2dBackwardFilter(c2, a1, dh2, &g[1]));
  EXPECT_OK(be->Conv2dBackwardData(c2, dh2, p[1], &da1));
  bwd_bn(0, relu_bn, h1, da1, &a1, &dh1);
  EXPECT_OK(be->Conv2dBackwardFilter(c1, x, dh1, &g[0]));
  EXPECT_OK(be->Conv2dBackwardData(c1, dh1, p[0], &dx1));
  bwd_bn(3, plain_bn, hd, dsum, nullptr, &dhd);
  EXPECT_OK(be->Conv2dBackwardFilter(cd, x, dhd, &g[3]));
  EXPECT_OK(be->Conv2dBackwardData(cd, dhd, p[3], &dxd));
  EXPECT_OK(be->Add(dx1, dxd, &dx, /*relu=*/false));
  r.grads = Host(be, grads);
  r.dx = Download(be, dx);
  for (const Bn& b : bn) {
    for (const Tensor* t : {&b.rm, &b.rv}) {
      std::vector<float> v = Host(be, *t);
      r.stats.insert(r.stats.end(), v.begin(), v.end());
    }
  }
  // Nesterov SGD with weight decay on everything (the update kernel's every branch).
  SgdParams sp;
  sp.lr = 0.05f;
  sp.weight_decay = 1e-3f;
  sp.nesterov = true;
  EXPECT_OK(be->SgdUpdate(sp, &flat, grads, &mom, 0, lay.total));
  r.params = Host(be, flat);
  return r;
}

// The block in the precisions it can check: fp16 divides parameter gradients by the loss scale that
// only SoftmaxCrossEntropy applies to dlogits, and this block takes dy = R directly, so fp16 is not
// instantiated here (ResNet20TrainingStep covers it) rather than instantiated and skipped.
class CudaBlockParityTest : public CudaParityTest {};

TEST_P(CudaBlockParityTest, ResNet50BottleneckBlock) {
  const Tolerance tol = GetParam();
  const BlockShape s;
  const BlockLayout lay(s);
  std::vector<float> init = RandomVector(lay.total, 51, -0.2f, 0.2f);
  for (size_t i = 4; i < lay.shapes.size(); i += 2) {  // gamma near 1, beta near 0
    for (int64_t j = 0; j < Numel(lay.shapes[i]); ++j) init[lay.offsets[i] + j] += 1.f;
  }
  const std::vector<float> xh = RandomVector(s.n * s.cin * s.size * s.size, 52);
  const int64_t o = Conv2dParams{3, s.stride, 1}.OutSize(s.size);
  const std::vector<float> rh = RandomVector(s.n * s.cout * o * o, 53);
  BlockResult a = RunBlock(cpu_.get(), s, init, xh, rh);
  BlockResult b = RunBlock(cuda_.get(), s, init, xh, rh);
  const double loss_diff = std::fabs(a.loss - b.loss) / std::max(1e-6, std::fabs(a.loss));
  std::cout << "  [" << tol.precision << "] bottleneck loss cpu " << a.loss << " cuda " << b.loss
            << " rel diff " << loss_diff << "\n";
  EXPECT_LE(loss_diff, tol.loss * 10);  // L = sum(y .* R) cancels: judge it 10x looser
  const char* names[] = {"conv1.w", "conv2.w", "conv3.w", "down.w", "bn1.g", "bn1.b",
                         "bn2.g",   "bn2.b",   "bn3.g",   "bn3.b",  "bnd.g", "bnd.b"};
  double worst = 0;
  for (size_t i = 0; i < lay.shapes.size(); ++i) {
    auto slice = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + lay.offsets[i],
                                v.begin() + lay.offsets[i] + Numel(lay.shapes[i]));
    };
    const double d = tol.min_cosine > 0 ? MaxRelDiff(slice(a.grads), slice(b.grads))
                                        : ExpectClose(std::string("grad ") + names[i],
                                                      slice(a.grads), slice(b.grads), tol.block);
    std::cout << "    grad " << names[i] << " max rel diff " << d << "\n";
    worst = std::max(worst, d);
  }
  double dx = 0, upd = 0;
  if (tol.min_cosine > 0) {
    ExpectAligned("bottleneck gradients", a.grads, b.grads, tol);
    ExpectAligned("bottleneck dx", a.dx, b.dx, tol);
    ExpectAligned("bottleneck updated weights", a.params, b.params, tol);
    dx = MaxRelDiff(a.dx, b.dx);
    upd = MaxRelDiff(a.params, b.params);
  } else {
    dx = ExpectClose("dx", a.dx, b.dx, tol.block);
    upd = ExpectClose("updated weights", a.params, b.params, tol.block);
  }
  const double stats = ExpectClose("BN running statistics", a.stats, b.stats, tol.block);
  std::cout << "  [" << tol.precision << "] bottleneck max rel diff: gradients " << worst << ", dx "
            << dx << ", updated weights " << upd << ", BN running stats " << stats << " (tolerance "
            << tol.block << ")\n";
}

std::string PrecisionName(const ::testing::TestParamInfo<Tolerance>& info) {
  return info.param.precision;
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaParityTest, ::testing::ValuesIn(kTolerances),
                         PrecisionName);
INSTANTIATE_TEST_SUITE_P(Precisions, CudaBlockParityTest,
                         ::testing::Values(kTolerances[0], kTolerances[1]), PrecisionName);

}  // namespace
}  // namespace edl::resnet50::test
