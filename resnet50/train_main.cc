// `edl train`: flags -> datasets -> Trainer -> standalone loop. Every flag and its default is
// declared in Flags() below (shown by --help).
#include "resnet50/train_main.h"

#include <iostream>
#include <sstream>
#include <string>

#include "edl/base/flags.h"
#include "resnet50/data/dataset.h"
#include "resnet50/train_loop.h"
#include "resnet50/trainer.h"

namespace edl::resnet50 {

namespace {

struct Config {
  std::string model, data, data_dir, device, lr_decay, lr_milestones, precision;
  int image_size = 0, channels = 3, threads = 0;
  int64_t batch_size = 128, epochs = 1, max_steps = 0, log_every = 50, base_batch = 128;
  int64_t synthetic_train = 0, synthetic_test = 0;
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, label_smoothing = 0, warmup_epochs = 0;
  bool nesterov = false, zero_init_residual = false, augment = false, eval = true;
  bool decay_bn_and_bias = false;
  uint64_t seed = 1;
};

po::options_description Flags(Config* c) {
  po::options_description d("edl train flags");
  d.add_options()
      ("model", po::value(&c->model)->default_value("resnet20"),
       "resnet20|resnet56 (28/32 px) or resnet18|resnet34|resnet50|resnet101 (224 px)")
      ("data", po::value(&c->data)->default_value("fashion-mnist"), "fashion-mnist|synthetic")
      ("data_dir", po::value(&c->data_dir)->default_value("/usr/share/datasets/fashion-mnist"),
       "directory with the Fashion-MNIST IDX files (.gz or plain)")
      ("image_size", po::value(&c->image_size)->default_value(0),
       "image side in px; 0 = 28 for fashion-mnist, 32 (resnet20/56) or 224 for synthetic; "
       "fashion-mnist images are zero-padded to it")
      ("channels", po::value(&c->channels)->default_value(3, "3"), "synthetic image channels")
      ("synthetic_train", po::value(&c->synthetic_train)->default_value(0),
       "synthetic training samples; 0 = 100 batches")
      ("synthetic_test", po::value(&c->synthetic_test)->default_value(0),
       "synthetic test samples; 0 = 4 batches")
      ("batch_size", po::value(&c->batch_size)->default_value(128, "128"), "samples per step per trainer")
      ("epochs", po::value(&c->epochs)->default_value(1, "1"), "training epochs")
      ("max_steps", po::value(&c->max_steps)->default_value(0, "0"), "stop after this many steps; 0 = no limit")
      ("lr", po::value(&c->lr)->default_value(0.1, "0.1"), "learning rate at --base_batch samples per step")
      ("base_batch", po::value(&c->base_batch)->default_value(128),
       "linear scaling reference: lr * global_batch / base_batch; 0 disables scaling")
      ("momentum", po::value(&c->momentum)->default_value(0.9, "0.9"), "SGD momentum")
      ("weight_decay", po::value(&c->weight_decay)->default_value(5e-4),
       "L2 weight decay on conv/fc weights")
      ("decay_bn_and_bias", po::value(&c->decay_bn_and_bias)->default_value(false),
       "also apply weight decay to BN parameters and biases")
      ("nesterov", po::value(&c->nesterov)->default_value(false), "Nesterov momentum")
      ("label_smoothing", po::value(&c->label_smoothing)->default_value(0.0, "0.0"), "label smoothing eps")
      ("warmup_epochs", po::value(&c->warmup_epochs)->default_value(0.0, "0.0"), "linear LR warm-up, in epochs")
      ("lr_decay", po::value(&c->lr_decay)->default_value("cosine"), "constant|step|cosine")
      ("lr_milestones", po::value(&c->lr_milestones)->default_value(""),
       "step decay: comma-separated epochs where the LR is multiplied by 0.1")
      ("zero_init_residual", po::value(&c->zero_init_residual)->default_value(false),
       "start each block's last BN gamma at 0")
      ("augment", po::value(&c->augment)->default_value(false),
       "random crop (pad 4) and horizontal flip of training images")
      ("seed", po::value(&c->seed)->default_value(1, "1"), "init, data order and augmentation seed")
      ("threads", po::value(&c->threads)->default_value(0),
       "CPU compute threads; 0 = cores / trainers on this node (LOCAL_WORLD_SIZE or EDL_LOCAL_TRAINERS)")
      ("log_every", po::value(&c->log_every)->default_value(50, "50"), "progress line every N steps; 0 = none")
      ("eval", po::value(&c->eval)->default_value(true), "evaluate on the test split after every epoch")
      ("device", po::value(&c->device)->default_value("cpu"), "cpu|cuda|auto")
      ("precision", po::value(&c->precision)->default_value("fp32"),
       "cuda: fp32|bf16|fp16 activations and convolutions (fp32 master weights; fp16 adds loss "
       "scaling); cpu: fp32 only");
  return d;
}

Status ParseMilestones(const std::string& text, std::vector<double>* out) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      out->push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      return Status::InvalidArgument("--lr_milestones: '" + item + "' is not a number");
    }
  }
  return Status::OK();
}

bool IsCifarModel(const std::string& m) { return m == "resnet20" || m == "resnet56"; }

Status LoadData(const Config& c, std::unique_ptr<Dataset>* train, std::unique_ptr<Dataset>* test) {
  if (c.data == "fashion-mnist") {
    const int size = c.image_size == 0 ? 28 : c.image_size;
    auto tr = LoadFashionMnist(c.data_dir, true, size);
    if (!tr.ok()) return tr.status();
    *train = std::move(tr.value());
    if (c.eval) {
      auto te = LoadFashionMnist(c.data_dir, false, size);
      if (!te.ok()) return te.status();
      *test = std::move(te.value());
    }
    return Status::OK();
  }
  if (c.data == "synthetic") {
    const int size = c.image_size != 0 ? c.image_size : (IsCifarModel(c.model) ? 32 : 224);
    if (c.channels != 1 && c.channels != 3) {
      return Status::InvalidArgument("--channels must be 1 or 3");
    }
    const int64_t ntrain = c.synthetic_train > 0 ? c.synthetic_train : 100 * c.batch_size;
    const int64_t ntest = c.synthetic_test > 0 ? c.synthetic_test : 4 * c.batch_size;
    *train = MakeSyntheticDataset(ntrain, c.channels, size, 10, c.seed);
    if (c.eval) *test = MakeSyntheticDataset(ntest, c.channels, size, 10, c.seed + 1);
    return Status::OK();
  }
  return Status::InvalidArgument("--data '" + c.data + "' is unknown; use fashion-mnist or synthetic");
}

Status Validate(const Config& c) {
  if (c.batch_size <= 0) return Status::InvalidArgument("--batch_size must be > 0, got " + std::to_string(c.batch_size));
  if (c.epochs <= 0) return Status::InvalidArgument("--epochs must be > 0");
  if (c.max_steps < 0) return Status::InvalidArgument("--max_steps must be >= 0");
  if (c.threads < 0) return Status::InvalidArgument("--threads must be >= 0");
  if (c.image_size < 0) return Status::InvalidArgument("--image_size must be >= 0");
  if (c.lr <= 0) return Status::InvalidArgument("--lr must be > 0");
  if (c.device != "cpu" && c.device != "cuda" && c.device != "auto") {
    return Status::InvalidArgument("--device '" + c.device + "' is unknown; use cpu, cuda or auto");
  }
  if (c.precision != "fp32" && c.precision != "bf16" && c.precision != "fp16") {
    return Status::InvalidArgument("--precision '" + c.precision + "' is unknown; use fp32, bf16 or fp16");
  }
  if (c.device == "cpu" && c.precision != "fp32") {
    return Status::InvalidArgument("--precision " + c.precision + " needs --device cuda (or auto); the CPU backend is fp32");
  }
  ModelConfig mc;
  mc.name = c.model;
  // The model is checked against the data's shape in Trainer::Create; check the name early.
  mc.in_channels = 1;
  mc.image_size = IsCifarModel(c.model) ? 28 : 224;
  return ValidateModelConfig(mc);
}

}  // namespace

int RunTrainMain(int argc, char** argv) {
  Config c;
  po::options_description desc = Flags(&c);
  ParsedFlags parsed;
  Status s = ParseFlags("train", "usage: edl train [flags]\nTrains a ResNet standalone (world size 1).",
                        desc, argc, argv, &parsed);
  if (!s.ok()) {
    std::cerr << "edl train: " << s.ToString() << "\n";
    return 2;
  }
  if (parsed.help) return 0;
  s = Validate(c);
  std::unique_ptr<Dataset> train, test;
  if (s.ok()) s = LoadData(c, &train, &test);
  std::unique_ptr<Trainer> trainer;
  if (s.ok()) {
    TrainerOptions to;
    to.device = c.device;
    to.precision = c.precision;
    to.threads = c.threads;
    to.model.name = c.model;
    to.model.zero_init_residual = c.zero_init_residual;
    to.model.decay_bn_and_bias = c.decay_bn_and_bias;
    to.momentum = static_cast<float>(c.momentum);
    to.weight_decay = static_cast<float>(c.weight_decay);
    to.nesterov = c.nesterov;
    to.label_smoothing = static_cast<float>(c.label_smoothing);
    to.augment.random_crop = to.augment.flip = c.augment;
    to.seed = c.seed;
    auto t = Trainer::Create(to, std::move(train), std::move(test));
    if (t.ok()) trainer = std::move(t.value());
    else s = t.status();
  }
  LoopOptions lo;
  if (s.ok()) {
    lo.batch_size = c.batch_size;
    lo.epochs = c.epochs;
    lo.max_steps = c.max_steps;
    lo.log_every = c.log_every;
    lo.eval = c.eval;
    lo.seed = c.seed;
    lo.lr.base_lr = c.lr;
    lo.lr.base_batch = c.base_batch;
    lo.lr.warmup_epochs = c.warmup_epochs;
    lo.lr.decay = c.lr_decay;
    s = ParseMilestones(c.lr_milestones, &lo.lr.milestones);
    lo.threads = trainer ? trainer->threads() : 0;
    lo.label = c.model + " " + c.data;
  }
  if (!s.ok()) {
    std::cerr << "edl train: " << s.ToString() << "\n";
    return 2;
  }
  std::cout << "edl train: " << c.model << " on " << trainer->train_data().name() << " ("
            << trainer->train_size() << " train / " << trainer->test_size() << " test, "
            << trainer->model()->num_params() << " parameters), device "
            << trainer->backend()->name() << ", threads " << trainer->threads() << ", batch "
            << c.batch_size << std::endl;
  LoopResult result;
  s = RunStandaloneLoop(trainer.get(), lo, std::cout, &result);
  if (!s.ok()) {
    std::cerr << "edl train: " << s.ToString() << "\n";
    return s.code() == Status::Code::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace edl::resnet50
