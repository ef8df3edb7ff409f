// ResNet forward/backward on the Backend interface. See model.h for the architecture and the
// flat parameter layout.
#include "resnet50/model.h"

#include <cmath>
#include <random>
#include <utility>

#include "edl/runtime/trainable.h"

namespace edl::resnet50 {

namespace {

struct Arch {
  bool cifar;               // CIFAR stem (3x3 conv, no max pool) and 16/32/64 widths
  bool bottleneck;          // 1x1-3x3-1x1 blocks with expansion 4
  std::vector<int> blocks;  // blocks per stage
};

bool LookupArch(const std::string& name, Arch* arch) {
  if (name == "resnet20")
    *arch = {true, false, {3, 3, 3}};
  else if (name == "resnet56")
    *arch = {true, false, {9, 9, 9}};
  else if (name == "resnet18")
    *arch = {false, false, {2, 2, 2, 2}};
  else if (name == "resnet34")
    *arch = {false, false, {3, 4, 6, 3}};
  else if (name == "resnet50")
    *arch = {false, true, {3, 4, 6, 3}};
  else if (name == "resnet101")
    *arch = {false, true, {3, 4, 23, 3}};
  else
    return false;
  return true;
}

}  // namespace

// How a parameter starts. Outside the anonymous namespace because Model::Impl holds it: where
// model.cc is not the main file of its translation unit (cmake/unity.cmake), gcc warns about a
// member whose type has internal linkage (-Wsubobject-linkage).
enum class ParamInit { kHe, kOne, kZero, kFcUniform };

Status ValidateModelConfig(const ModelConfig& c) {
  Arch arch;
  if (!LookupArch(c.name, &arch)) {
    return Status::InvalidArgument("--model '" + c.name +
                                   "' is unknown; use resnet20, resnet56, resnet18, resnet34, "
                                   "resnet50 or resnet101");
  }
  if (c.num_classes < 2) return Status::InvalidArgument("the dataset must have >= 2 classes");
  if (arch.cifar) {
    if (c.in_channels != 1 && c.in_channels != 3) {
      return Status::InvalidArgument("--model " + c.name + " takes 1- or 3-channel images, got " +
                                     std::to_string(c.in_channels) + " channels");
    }
    if (c.image_size < 8 || c.image_size > 64 || c.image_size % 4 != 0) {
      return Status::InvalidArgument(
          "--image_size " + std::to_string(c.image_size) + " cannot be taken by --model " + c.name +
          " (CIFAR-style: a multiple of 4 in [8, 64], e.g. 28 or 32); use resnet18/50 "
          "for larger images");
    }
  } else {
    if (c.in_channels != 3 && c.in_channels != 1) {
      return Status::InvalidArgument("--model " + c.name + " takes 1- or 3-channel images");
    }
    if (c.image_size < 64 || c.image_size > 512 || c.image_size % 32 != 0) {
      return Status::InvalidArgument(
          "--image_size " + std::to_string(c.image_size) + " cannot be taken by --model " + c.name +
          " (ImageNet-style: a multiple of 32 in [64, 512], e.g. 224); use resnet20/56 "
          "for 28/32 px images");
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Layers. Shapes: N batch; activations [N, C, S, S] in Layout::kNative.

struct ConvBn {
  Conv2dParams p;
  int64_t cin = 0, cout = 0, in_size = 0, out_size = 0;
  bool relu = true;                  // ReLU fused after the BN
  bool need_dx = true;               // false for the stem: no gradient w.r.t. the images
  int w = -1, g = -1, b = -1;        // indices into Model::params_
  Tensor running_mean, running_var;  // [cout]
  // Per-batch state.
  const Tensor* input = nullptr;  // the last Forward's x (owned by the caller)
  Tensor conv_out, bn_out;        // [N, cout, out, out]
  Tensor save_mean, save_invstd;  // [cout]
  Tensor d_conv;                  // [N, cout, out, out]
  Tensor dx;                      // [N, cin, in, in] when need_dx
};

struct Block {
  std::vector<ConvBn> main;
  std::unique_ptr<ConvBn> down;  // projection shortcut, when the shape changes
  Tensor out, d_sum, dx;         // out/d_sum [N, cout, s, s]; dx [N, cin, in, in]
};

struct Model::Impl {
  Backend* be;
  ConvBn stem;
  bool maxpool = false;
  PoolParams pool;
  std::vector<Block> blocks;
  int fc_w = -1, fc_b = -1;
  int64_t feat = 0;                  // channels into the fc
  int64_t last_size = 0;             // spatial size of the last block's output
  std::vector<ParamInit> init;       // per param
  std::vector<Tensor> pview, gview;  // per param: views into the flat buffers
  // Per-batch state.
  int64_t batch = -1;
  Tensor pool_out, d_pool_in;  // max pool output / grad w.r.t. its input
  Tensor pooled, logits, d_pooled, d_last;

  Status Alloc(int64_t n);
  void AllocConvBn(ConvBn* c, int64_t n);
  Status FwdConvBn(ConvBn* c, const Tensor& x, bool training);
  Status BwdConvBn(ConvBn* c, const Tensor& dy);
  Status FwdBlock(Block* b, const Tensor& x, bool training);
  Status BwdBlock(Block* b, const Tensor& dy);
};

void Model::Impl::AllocConvBn(ConvBn* c, int64_t n) {
  const Shape os{n, c->cout, c->out_size, c->out_size};
  c->conv_out = Tensor(be, os, Layout::kNative);
  c->bn_out = Tensor(be, os, Layout::kNative);
  c->d_conv = Tensor(be, os, Layout::kNative);
  c->save_mean = Tensor(be, {c->cout});
  c->save_invstd = Tensor(be, {c->cout});
  if (c->need_dx) c->dx = Tensor(be, {n, c->cin, c->in_size, c->in_size}, Layout::kNative);
}

Status Model::Impl::Alloc(int64_t n) {
  if (n == batch) return Status::OK();
  batch = n;
  AllocConvBn(&stem, n);
  if (maxpool) {
    const int64_t s = pool.OutSize(stem.out_size);
    pool_out = Tensor(be, {n, stem.cout, s, s}, Layout::kNative);
    d_pool_in = Tensor(be, {n, stem.cout, stem.out_size, stem.out_size}, Layout::kNative);
  }
  for (Block& b : blocks) {
    for (ConvBn& c : b.main) AllocConvBn(&c, n);
    if (b.down) AllocConvBn(b.down.get(), n);
    const ConvBn& last = b.main.back();
    const Shape os{n, last.cout, last.out_size, last.out_size};
    b.out = Tensor(be, os, Layout::kNative);
    b.d_sum = Tensor(be, os, Layout::kNative);
    const ConvBn& first = b.main.front();
    b.dx = Tensor(be, {n, first.cin, first.in_size, first.in_size}, Layout::kNative);
  }
  const int64_t classes = pview[fc_b].dim(0);
  pooled = Tensor(be, {n, feat});
  d_pooled = Tensor(be, {n, feat});
  logits = Tensor(be, {n, classes});
  d_last = Tensor(be, {n, feat, last_size, last_size}, Layout::kNative);
  if (!d_last.ok() || !logits.ok()) {
    return Status::Internal("out of memory allocating activations for batch " + std::to_string(n));
  }
  return Status::OK();
}

Status Model::Impl::FwdConvBn(ConvBn* c, const Tensor& x, bool training) {
  c->input = &x;
  EDL_RETURN_IF_ERROR(be->Conv2dForward(c->p, x, pview[c->w], &c->conv_out));
  BatchNormParams bp;
  bp.fuse_relu = c->relu;
  if (training) {
    return be->BatchNormForwardTraining(bp, c->conv_out, pview[c->g], pview[c->b], &c->bn_out,
                                        &c->save_mean, &c->save_invstd, &c->running_mean,
                                        &c->running_var);
  }
  return be->BatchNormForwardInference(bp, c->conv_out, pview[c->g], pview[c->b], c->running_mean,
                                       c->running_var, &c->bn_out);
}

Status Model::Impl::BwdConvBn(ConvBn* c, const Tensor& dy) {
  BatchNormParams bp;
  bp.fuse_relu = c->relu;
  EDL_RETURN_IF_ERROR(be->BatchNormBackward(bp, c->conv_out, dy, c->relu ? &c->bn_out : nullptr,
                                            pview[c->g], c->save_mean, c->save_invstd, &c->d_conv,
                                            &gview[c->g], &gview[c->b]));
  EDL_RETURN_IF_ERROR(be->Conv2dBackwardFilter(c->p, *c->input, c->d_conv, &gview[c->w]));
  if (c->need_dx) return be->Conv2dBackwardData(c->p, c->d_conv, pview[c->w], &c->dx);
  return Status::OK();
}

Status Model::Impl::FwdBlock(Block* b, const Tensor& x, bool training) {
  const Tensor* h = &x;
  for (ConvBn& c : b->main) {
    EDL_RETURN_IF_ERROR(FwdConvBn(&c, *h, training));
    h = &c.bn_out;
  }
  const Tensor* shortcut = &x;
  if (b->down) {
    EDL_RETURN_IF_ERROR(FwdConvBn(b->down.get(), x, training));
    shortcut = &b->down->bn_out;
  }
  return be->Add(*h, *shortcut, &b->out, /*relu=*/true);
}

Status Model::Impl::BwdBlock(Block* b, const Tensor& dy) {
  EDL_RETURN_IF_ERROR(be->ReluBackward(b->out, dy, &b->d_sum));
  const Tensor* d = &b->d_sum;
  for (int i = static_cast<int>(b->main.size()) - 1; i >= 0; --i) {
    EDL_RETURN_IF_ERROR(BwdConvBn(&b->main[i], *d));
    d = &b->main[i].dx;
  }
  const Tensor* ds = &b->d_sum;
  if (b->down) {
    EDL_RETURN_IF_ERROR(BwdConvBn(b->down.get(), b->d_sum));
    ds = &b->down->dx;
  }
  return be->Add(*d, *ds, &b->dx, /*relu=*/false);
}

// ---------------------------------------------------------------------------------------------
// Model

Model::Model(Backend* backend, const ModelConfig& config)
    : backend_(backend), config_(config), impl_(new Impl) {
  impl_->be = backend;
}

Model::~Model() = default;

std::vector<Model::BufferInfo> Model::buffers() {
  std::vector<BufferInfo> out;
  auto add = [&](const std::string& bn, ConvBn* c) {
    out.push_back({bn + ".running_mean", &c->running_mean});
    out.push_back({bn + ".running_var", &c->running_var});
  };
  add("bn1", &impl_->stem);
  for (size_t bi = 0; bi < impl_->blocks.size(); ++bi) {
    Block& b = impl_->blocks[bi];
    // The BN name is the gamma param's name without ".weight".
    for (ConvBn& c : b.main) {
      const std::string& n = params_[c.g].name;
      add(n.substr(0, n.size() - 7), &c);
    }
    if (b.down) {
      const std::string& n = params_[b.down->g].name;
      add(n.substr(0, n.size() - 7), b.down.get());
    }
  }
  return out;
}

StatusOr<std::unique_ptr<Model>> Model::Create(Backend* backend, const ModelConfig& config) {
  EDL_RETURN_IF_ERROR(ValidateModelConfig(config));
  std::unique_ptr<Model> m(new Model(backend, config));
  EDL_RETURN_IF_ERROR(m->Build());
  return m;
}

Status Model::Build() {
  Arch arch;
  LookupArch(config_.name, &arch);
  Impl& im = *impl_;
  auto add_param = [&](const std::string& name, Shape shape, bool decay, ParamInit init) {
    params_.push_back({name, std::move(shape), 0, decay || config_.decay_bn_and_bias});
    im.init.push_back(init);
    return static_cast<int>(params_.size()) - 1;
  };
  // A conv + BN pair named like torchvision ("<conv>.weight", "<bn>.weight/.bias").
  auto make = [&](ConvBn* c, const std::string& conv, const std::string& bn, int64_t cin,
                  int64_t cout, int k, int stride, int64_t in_size, bool relu, bool zero_gamma) {
    c->p = Conv2dParams{k, stride, k / 2};
    c->cin = cin;
    c->cout = cout;
    c->in_size = in_size;
    c->out_size = c->p.OutSize(in_size);
    c->relu = relu;
    c->w = add_param(conv + ".weight", {cout, cin, k, k}, true, ParamInit::kHe);
    c->g =
        add_param(bn + ".weight", {cout}, false, zero_gamma ? ParamInit::kZero : ParamInit::kOne);
    c->b = add_param(bn + ".bias", {cout}, false, ParamInit::kZero);
    c->running_mean = Tensor(backend_, {cout});
    c->running_var = Tensor(backend_, {cout});
  };

  // Stem.
  const int64_t width0 = arch.cifar ? 16 : 64;
  int64_t size = config_.image_size;
  if (arch.cifar) {
    make(&im.stem, "conv1", "bn1", config_.in_channels, width0, 3, 1, size, true, false);
  } else {
    make(&im.stem, "conv1", "bn1", config_.in_channels, width0, 7, 2, size, true, false);
    im.maxpool = true;
  }
  im.stem.need_dx = false;
  size = im.stem.out_size;
  if (im.maxpool) size = im.pool.OutSize(size);

  // Stages.
  int64_t cin = width0;
  const bool zero = config_.zero_init_residual;
  for (size_t s = 0; s < arch.blocks.size(); ++s) {
    const int64_t width = width0 << s;
    const int64_t cout = arch.bottleneck ? width * 4 : width;
    for (int i = 0; i < arch.blocks[s]; ++i) {
      const int stride = (i == 0 && s > 0) ? 2 : 1;
      const std::string pre = "layer" + std::to_string(s + 1) + "." + std::to_string(i) + ".";
      Block b;
      if (arch.bottleneck) {
        b.main.resize(3);
        make(&b.main[0], pre + "conv1", pre + "bn1", cin, width, 1, 1, size, true, false);
        make(&b.main[1], pre + "conv2", pre + "bn2", width, width, 3, stride, size, true, false);
        make(&b.main[2], pre + "conv3", pre + "bn3", width, cout, 1, 1, b.main[1].out_size, false,
             zero);
      } else {
        b.main.resize(2);
        make(&b.main[0], pre + "conv1", pre + "bn1", cin, width, 3, stride, size, true, false);
        make(&b.main[1], pre + "conv2", pre + "bn2", width, cout, 3, 1, b.main[0].out_size, false,
             zero);
      }
      if (stride != 1 || cin != cout) {
        b.down = std::make_unique<ConvBn>();
        make(b.down.get(), pre + "downsample.0", pre + "downsample.1", cin, cout, 1, stride, size,
             false, false);
        b.down->p.pad = 0;
      }
      size = b.main.back().out_size;
      cin = cout;
      im.blocks.push_back(std::move(b));
    }
  }
  im.feat = cin;
  im.last_size = size;
  im.fc_w = add_param("fc.weight", {config_.num_classes, cin}, true, ParamInit::kFcUniform);
  im.fc_b = add_param("fc.bias", {config_.num_classes}, false, ParamInit::kFcUniform);

  // Flat layout: decayed parameters first.
  int64_t off = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (ParamInfo& p : params_) {
      if (p.decay != (pass == 0)) continue;
      p.offset = off;
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      off += n;
    }
    if (pass == 0) decay_count_ = off;
  }
  num_params_ = off;
  flat_params_ = Tensor(backend_, {num_params_});
  flat_grads_ =
      Tensor(backend_, {num_params_ + static_cast<int64_t>(runtime::Trainable::kInbandSlots)});
  if (!flat_params_.ok() || !flat_grads_.ok()) {
    return Status::Internal("out of memory allocating " + std::to_string(num_params_) +
                            " parameters of " + config_.name);
  }
  for (const ParamInfo& p : params_) {
    im.pview.push_back(Tensor::View(backend_, flat_params_.data() + p.offset, p.shape));
    im.gview.push_back(Tensor::View(backend_, flat_grads_.data() + p.offset, p.shape));
  }

  // Initialisation on the host (He normal, fan_out, as torchvision), then one upload.
  std::vector<float> host(num_params_);
  std::mt19937_64 gen(config_.seed);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    float* dst = host.data() + p.offset;
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    if (im.init[i] == ParamInit::kHe) {
      const double fan_out = static_cast<double>(p.shape[0]) * p.shape[2] * p.shape[3];
      std::normal_distribution<float> dist(0.f, static_cast<float>(std::sqrt(2.0 / fan_out)));
      for (int64_t j = 0; j < n; ++j) dst[j] = dist(gen);
    } else if (im.init[i] == ParamInit::kFcUniform) {
      const float bound = 1.f / std::sqrt(static_cast<float>(cin));
      std::uniform_real_distribution<float> dist(-bound, bound);
      for (int64_t j = 0; j < n; ++j) dst[j] = dist(gen);
    } else {
      const float v = im.init[i] == ParamInit::kOne ? 1.f : 0.f;
      for (int64_t j = 0; j < n; ++j) dst[j] = v;
    }
  }
  EDL_RETURN_IF_ERROR(backend_->CopyFromHost(host.data(), &flat_params_));
  EDL_RETURN_IF_ERROR(backend_->Fill(&flat_grads_, 0.f));
  for (const BufferInfo& b : buffers()) {
    const bool is_var = b.name.size() > 3 && b.name.compare(b.name.size() - 3, 3, "var") == 0;
    EDL_RETURN_IF_ERROR(backend_->Fill(b.tensor, is_var ? 1.f : 0.f));
  }
  return Status::OK();
}

Status Model::Forward(const Tensor& x, bool training, const Tensor** logits) {
  Impl& im = *impl_;
  if (x.rank() != 4 || x.dim(1) != config_.in_channels || x.dim(2) != config_.image_size ||
      x.dim(3) != config_.image_size) {
    return Status::InvalidArgument("Model::Forward: input " + x.DebugString() + " does not match " +
                                   config_.name + " for " + std::to_string(config_.in_channels) +
                                   "x" + std::to_string(config_.image_size) + "^2 images");
  }
  EDL_RETURN_IF_ERROR(im.Alloc(x.dim(0)));
  EDL_RETURN_IF_ERROR(im.FwdConvBn(&im.stem, x, training));
  const Tensor* cur = &im.stem.bn_out;
  if (im.maxpool) {
    EDL_RETURN_IF_ERROR(backend_->MaxPool2dForward(im.pool, *cur, &im.pool_out));
    cur = &im.pool_out;
  }
  for (Block& b : im.blocks) {
    EDL_RETURN_IF_ERROR(im.FwdBlock(&b, *cur, training));
    cur = &b.out;
  }
  EDL_RETURN_IF_ERROR(backend_->GlobalAvgPoolForward(*cur, &im.pooled));
  EDL_RETURN_IF_ERROR(
      backend_->LinearForward(im.pooled, im.pview[im.fc_w], im.pview[im.fc_b], &im.logits));
  *logits = &im.logits;
  return Status::OK();
}

Status Model::Backward(const Tensor& dlogits) {
  Impl& im = *impl_;
  EDL_RETURN_IF_ERROR(backend_->LinearBackward(im.pooled, im.pview[im.fc_w], dlogits, &im.d_pooled,
                                               &im.gview[im.fc_w], &im.gview[im.fc_b]));
  EDL_RETURN_IF_ERROR(backend_->GlobalAvgPoolBackward(im.d_pooled, &im.d_last));
  const Tensor* d = &im.d_last;
  for (int i = static_cast<int>(im.blocks.size()) - 1; i >= 0; --i) {
    EDL_RETURN_IF_ERROR(im.BwdBlock(&im.blocks[i], *d));
    d = &im.blocks[i].dx;
  }
  if (im.maxpool) {
    EDL_RETURN_IF_ERROR(
        backend_->MaxPool2dBackward(im.pool, im.stem.bn_out, im.pool_out, *d, &im.d_pool_in));
    d = &im.d_pool_in;
  }
  return im.BwdConvBn(&im.stem, *d);
}

}  // namespace edl::resnet50
