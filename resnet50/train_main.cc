// `edl train`: flags -> datasets -> Trainer -> the runtime's run plan -> the elastic loop
// (train_loop.h). Every flag and its default is declared in Flags() below (shown by --help); each
// binds straight into the options struct that uses it (TrainerOptions, LoopOptions with the
// runtime's ElasticOptions, CheckpointLoaderOptions, the store's RocksDbStoreOptions), so no option
// is copied field by field.
//
// The mode (elastic under an edl client, restart mode, static under `edl launch`, standalone) is
// the runtime's decision from the env contract: edl/runtime/run_mode.h.
#include "resnet50/train_main.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/flags.h"
#include "edl/runtime/checkpoint_loader.h"
#include "edl/runtime/run_mode.h"
#include "resnet50/data/data_flags.h"
#include "resnet50/data/dataset.h"
#include "resnet50/distill_main.h"
#include "resnet50/train_loop.h"
#include "resnet50/trainer.h"

namespace edl::resnet50 {

namespace {

// Everything the flags set. Most flags bind directly into the structs the trainer, the loop and
// the runtime take; the few below them need parsing or a unit conversion (Finish()).
struct Config {
  TrainerOptions trainer;
  LoopOptions loop;                             // loop.elastic: the runtime's options
  runtime::CheckpointLoaderOptions checkpoint;  // checkpoint.save: when to save
  ckpt::RocksDbStoreOptions store;              // store.dir empty: no checkpoints
  DataFlags data;
  DistillFlags distill;
  // parsed or converted by Finish()
  std::string batch_policy, lr_milestones, comm = "auto";
  double comm_timeout_s = 30, generation_wait_s = 120;
  bool augment = false;
  // benchmark baseline and accounting
  bool plain_allreduce = false;
  std::string usage_log;

  int64_t batch() const { return loop.elastic.batch; }
  const std::string& model() const { return trainer.model.name; }
};

po::options_description Flags(Config* c) {
  po::options_description d("edl train flags");
  AddDataFlags(&d, &c->data);
  AddDistillFlags(&d, &c->distill);
  d.add_options()("model", po::value(&c->trainer.model.name)->default_value("resnet20"),
                  "resnet20|resnet56 (28/32 px) or resnet18|resnet34|resnet50|resnet101 (224 px)")(
      "batch_size", po::value(&c->loop.elastic.batch)->default_value(128, "128"),
      "samples per step: per trainer (fixed-local) or in total (fixed-global)")(
      "batch_policy", po::value(&c->batch_policy)->default_value("fixed-local"),
      "fixed-local (global batch = world x batch_size) | fixed-global (batch_size split across "
      "trainers)")("epochs", po::value(&c->loop.elastic.epochs)->default_value(1, "1"),
                   "training epochs")("max_steps",
                                      po::value(&c->loop.elastic.max_steps)->default_value(0, "0"),
                                      "stop after this many steps; 0 = no limit")(
      "lr", po::value(&c->loop.elastic.lr.base_lr)->default_value(0.1, "0.1"),
      "learning rate at --base_batch samples per step")(
      "base_batch", po::value(&c->loop.elastic.lr.base_batch)->default_value(128),
      "linear scaling reference: lr * global_batch / base_batch; 0 disables scaling")(
      "rescale_ramp_steps", po::value(&c->loop.elastic.lr.rescale_ramp_steps)->default_value(0),
      "after a re-form that changes the global batch, move the LR linearly to its new value over N "
      "steps")(
      "comm", po::value(&c->comm)->default_value("auto"),
      "communicator: auto (nccl for --device cuda when the CUDA plugin has NCCL, else gloo) | "
      "nccl (GPU memory, --device cuda only) | gloo (TCP; with --device cuda the gradients and "
      "state are staged through pinned host buffers)")(
      "comm_timeout_s", po::value(&c->comm_timeout_s)->default_value(30, "30"),
      "bound on communicator rendezvous and every collective (a hung peer fails after this)")(
      "generation_wait_s", po::value(&c->generation_wait_s)->default_value(120, "120"),
      "bound on waiting for a (new) generation: after a failure, or as a joiner to be committed")(
      "checkpoint_dir", po::value(&c->store.dir)->default_value(""),
      "RocksDB checkpoint store (local disk or NFS); empty = no checkpoints")(
      "checkpoint_steps", po::value(&c->checkpoint.save.checkpoint_steps)->default_value(0),
      "checkpoint every N steps (rank 0, in the background); 0 = no step trigger")(
      "checkpoint_secs", po::value(&c->checkpoint.save.checkpoint_secs)->default_value(0, "0"),
      "checkpoint every N seconds; 0 = no time trigger (a final checkpoint is always written)")(
      "keep_checkpoints", po::value(&c->store.keep_checkpoints)->default_value(3),
      "checkpoints kept")(
      "plain_allreduce", po::value(&c->plain_allreduce)->default_value(false),
      "benchmark baseline: a plain all-reduce loop without the elastic runtime (static world "
      "under `edl launch`; CPU only)")(
      "resident_batch", po::value(&c->trainer.resident_batch)->default_value(false),
      "benchmark flag: load and upload the first batch once and train on it every step "
      "(device-resident data, no per-step loading; bench/trainer_gpu.sh)")(
      "usage_log", po::value(&c->usage_log)->default_value(""),
      "benchmark flag: at exit append {\"trainer\",\"steps\",\"cpu_s\",\"plain\"} (this process's "
      "user+system CPU seconds) as one JSON line to this file")(
      "sample_log", po::value(&c->loop.elastic.sample_log_path)->default_value(""),
      "test flag: append each committed step's sample indices (JSON lines) to this file")(
      "momentum", po::value(&c->trainer.momentum)->default_value(0.9f, "0.9"), "SGD momentum")(
      "weight_decay", po::value(&c->trainer.weight_decay)->default_value(5e-4f, "0.0005"),
      "L2 weight decay on conv/fc weights")(
      "decay_bn_and_bias", po::value(&c->trainer.model.decay_bn_and_bias)->default_value(false),
      "also apply weight decay to BN parameters and biases")(
      "nesterov", po::value(&c->trainer.nesterov)->default_value(false), "Nesterov momentum")(
      "label_smoothing", po::value(&c->trainer.label_smoothing)->default_value(0.0f, "0.0"),
      "label smoothing eps")(
      "warmup_epochs", po::value(&c->loop.elastic.lr.warmup_epochs)->default_value(0.0, "0.0"),
      "linear LR warm-up, in epochs")("lr_decay",
                                      po::value(&c->loop.elastic.lr.decay)->default_value("cosine"),
                                      "constant|step|cosine")(
      "lr_milestones", po::value(&c->lr_milestones)->default_value(""),
      "step decay: comma-separated epochs where the LR is multiplied by 0.1")(
      "zero_init_residual", po::value(&c->trainer.model.zero_init_residual)->default_value(false),
      "start each block's last BN gamma at 0")(
      "augment", po::value(&c->augment)->default_value(false),
      "random crop (pad 4) and horizontal flip of training images; imagefolder always trains with "
      "RandomResizedCrop + flip")("seed", po::value(&c->trainer.seed)->default_value(1, "1"),
                                  "init, data order and augmentation seed")(
      "threads", po::value(&c->trainer.threads)->default_value(0),
      "CPU compute threads; 0 = cores / trainers on this node (EDL_LOCAL_TRAINERS, else "
      "LOCAL_WORLD_SIZE)")("log_every", po::value(&c->loop.log_every)->default_value(50, "50"),
                           "progress line every N steps; 0 = none")(
      "eval", po::value(&c->loop.eval)->default_value(true),
      "evaluate on the test split after every epoch")(
      "device", po::value(&c->trainer.device)->default_value("cpu"), "cpu|cuda|auto")(
      "cuda_device", po::value(&c->trainer.cuda_device)->default_value(-1, "-1"),
      "CUDA device ordinal (after CUDA_VISIBLE_DEVICES) for the model and NCCL; -1 = the slot "
      "(EDL_SLOT, under edl client) or LOCAL_RANK modulo the visible devices when more than one is "
      "visible, else 0")(
      "precision", po::value(&c->trainer.precision)->default_value("fp32"),
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

Status Validate(const Config& c) {
  const runtime::ElasticOptions& e = c.loop.elastic;
  const TrainerOptions& t = c.trainer;
  if (e.batch <= 0)
    return Status::InvalidArgument("--batch_size must be > 0, got " + std::to_string(e.batch));
  if (e.epochs <= 0) return Status::InvalidArgument("--epochs must be > 0");
  if (e.max_steps < 0) return Status::InvalidArgument("--max_steps must be >= 0");
  if (t.threads < 0) return Status::InvalidArgument("--threads must be >= 0");
  if (e.lr.base_lr <= 0) return Status::InvalidArgument("--lr must be > 0");
  EDL_RETURN_IF_ERROR(ValidateDataFlags(c.data));
  EDL_RETURN_IF_ERROR(ValidateDistillFlags(c.distill));
  if (e.lr.rescale_ramp_steps < 0)
    return Status::InvalidArgument("--rescale_ramp_steps must be >= 0");
  if (c.comm_timeout_s <= 0) return Status::InvalidArgument("--comm_timeout_s must be > 0");
  if (c.generation_wait_s <= 0) return Status::InvalidArgument("--generation_wait_s must be > 0");
  if (c.checkpoint.save.checkpoint_steps < 0 || c.checkpoint.save.checkpoint_secs < 0) {
    return Status::InvalidArgument("--checkpoint_steps and --checkpoint_secs must be >= 0");
  }
  if (c.store.keep_checkpoints < 1)
    return Status::InvalidArgument("--keep_checkpoints must be >= 1");
  if (t.device != "cpu" && t.device != "cuda" && t.device != "auto") {
    return Status::InvalidArgument("--device '" + t.device + "' is unknown; use cpu, cuda or auto");
  }
  if (c.comm != "auto" && c.comm != "nccl" && c.comm != "gloo") {
    return Status::InvalidArgument("--comm '" + c.comm + "' is unknown; use auto, nccl or gloo");
  }
  if (t.device == "cpu" && c.comm == "nccl") {  // checked again once --device auto is resolved
    return Status::InvalidArgument(
        "--comm nccl needs --device cuda: NCCL reduces GPU memory and a CPU trainer's tensors are "
        "in host memory; use --comm gloo (or auto) with --device cpu");
  }
  if (t.precision != "fp32" && t.precision != "bf16" && t.precision != "fp16") {
    return Status::InvalidArgument("--precision '" + t.precision +
                                   "' is unknown; use fp32, bf16 or fp16");
  }
  if (t.cuda_device < -1) {
    return Status::InvalidArgument(
        "--cuda_device " + std::to_string(t.cuda_device) +
        " is not a device ordinal; use 0, 1, ... or -1 (the slot, or LOCAL_RANK, modulo the "
        "visible devices)");
  }
  if (t.device == "cpu" && t.precision != "fp32") {
    return Status::InvalidArgument("--precision " + t.precision +
                                   " needs --device cuda (or auto); the CPU backend is fp32");
  }
  ModelConfig mc;
  mc.name = c.model();
  // The model is checked against the data's shape in Trainer::Create; check the name early.
  mc.in_channels = 1;
  mc.image_size = IsCifarModel(c.model()) ? 28 : 224;
  return ValidateModelConfig(mc);
}

// --usage_log: one line with this process's CPU time (bench/rescale.sh compares the runtime's
// CPU per image with the plain all-reduce loop's, which is robust to a shared, busy machine).
void AppendUsage(const Config& c, const std::string& trainer, const LoopResult& r) {
  if (c.usage_log.empty()) return;
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  const double cpu = u.ru_utime.tv_sec + u.ru_stime.tv_sec +
                     1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  const std::string line =
      nlohmann::json{
          {"trainer", trainer}, {"steps", r.steps}, {"cpu_s", cpu}, {"plain", c.plain_allreduce}}
          .dump() +
      "\n";
  std::ofstream(c.usage_log, std::ios::app) << line;  // best effort
}

// Exit code 2: the setup failed (flags, data, model, membership); 1: training failed.
int Fail(const Status& s, int code = 2) {
  std::cerr << "edl train: " << s.ToString() << "\n";
  return code;
}

// The flags that need parsing or a unit conversion, and the few values shared by two structs.
Status Finish(Config* c) {
  runtime::ElasticOptions& e = c->loop.elastic;
  EDL_RETURN_IF_ERROR(runtime::ParseBatchPolicy(c->batch_policy, &e.batch_policy));
  EDL_RETURN_IF_ERROR(ParseMilestones(c->lr_milestones, &e.lr.milestones));
  e.comm_timeout = std::chrono::milliseconds(static_cast<int64_t>(c->comm_timeout_s * 1000));
  e.generation_wait = std::chrono::milliseconds(static_cast<int64_t>(c->generation_wait_s * 1000));
  e.seed = c->trainer.seed;  // one --seed: init, augmentation and data order
  // Augmentation is seeded by (seed, epoch, sample index) inside the loader: nothing to sync on
  // re-form.
  c->trainer.augment.random_crop = c->trainer.augment.flip =
      c->augment || c->data.data == "imagefolder";
  c->loop.label = c->model() + " " + c->data.data;
  return Status::OK();
}

// The datasets a trainer trains and evaluates on: loaded ahead by a host spare, else by
// MakeTrainer.
struct Datasets {
  std::unique_ptr<Dataset> train, test;
};

Status LoadDatasets(const Config& c, Datasets* d) {
  return LoadData(c.data, c.model(), c.batch(), c.trainer.seed, c.loop.eval, &d->train, &d->test);
}

// The trainer, on `ahead`'s datasets when a host spare loaded them (taken), else on its own.
StatusOr<std::unique_ptr<Trainer>> MakeTrainer(const Config& c, Datasets* ahead = nullptr) {
  Datasets d;
  if (ahead != nullptr && ahead->train) {
    d = std::move(*ahead);
    std::cout << "edl train: on the data the spare loaded before its assignment" << std::endl;
  } else {
    EDL_RETURN_IF_ERROR(LoadDatasets(c, &d));
  }
  return Trainer::Create(c.trainer, std::move(d.train), std::move(d.test));
}

// A warm spare (EDL_SPARE, docs/TRAINERS.md "Warm spares"): a full spare loads the data, builds the
// trainer and warms it up at the world it expects to join; a host spare loads the data into *ahead
// (no device in it) and builds nothing: its device is named by the assignment, and CUDA must not
// start before it. A full spare of a trainer that may run on a GPU (--device cuda or auto)
// prepares as a host spare too: which GPU is its slot's (EnvContract::DeviceHint), known only at
// the assignment. Then it waits for the client's assignment and turns *plan into the assigned one.
// The prepared trainer, or Unavailable when there is none (a host spare; an assignment whose
// threads differ from what the spare prepared for: the caller builds it). *released: the client
// let the spare go before assigning it (exit 0).
StatusOr<std::unique_ptr<Trainer>> PrepareSpare(Config* c, runtime::RunPlan* plan, bool* released,
                                                Datasets* ahead) {
  const int64_t t0 = Clock::Real()->NowMicros();
  const runtime::EnvContract spare = plan->env;
  TrainerOptions o = c->trainer;
  o.trainers_on_node = spare.TrainersOnNode();
  o.device_hint = spare.DeviceHint();
  std::unique_ptr<Trainer> prepared;
  int64_t warmed = 0;
  if (spare.spare == runtime::SpareKind::kFull && o.device == "cpu") {
    auto t = MakeTrainer([&] {
      Config copy = *c;
      copy.trainer = o;
      return copy;
    }());
    if (!t.ok()) return t.status();
    prepared = std::move(t.value());
    // A replacement restores the job's size: it joins at its largest world, ranked last.
    warmed = runtime::WarmUpSamples(prepared->train_size(), c->loop.elastic.batch_policy,
                                    c->loop.elastic.batch, std::max(1, spare.world_size));
    EDL_RETURN_IF_ERROR(runtime::WarmUpTrainable(prepared.get(), warmed));
  } else {
    EDL_RETURN_IF_ERROR(LoadDatasets(*c, ahead));
  }
  std::cout << "edl train: spare " << spare.trainer_id << " prepared in "
            << (Clock::Real()->NowMicros() - t0) / 1e6 << " s ("
            << (prepared ? "data, model, warm-up on " + std::to_string(warmed) + " samples"
                         : "host spare: the data, " + std::to_string(ahead->train->size()) +
                               " training samples; the model waits for its device")
            << "); waiting to be assigned" << std::endl;
  auto assigned = runtime::AwaitAssignment(*plan);
  if (!assigned.ok()) {
    *released = assigned.status().code() == Status::Code::kAborted;
    if (*released) std::cout << "edl train: " << assigned.status().message() << std::endl;
    return assigned.status();
  }
  *plan = std::move(assigned.value());
  std::cout << "edl train: spare " << spare.trainer_id << " is now trainer " << plan->env.trainer_id
            << std::endl;
  if (!prepared) return Status::Unavailable("no trainer prepared");
  const auto threads = [&](int trainers_on_node) {
    return o.threads > 0 ? o.threads : DefaultThreads(trainers_on_node);
  };
  if (threads(plan->env.TrainersOnNode()) != threads(o.trainers_on_node)) {
    std::cout << "edl train: the assignment's threads differ from the spare's; building anew"
              << std::endl;
    return Status::Unavailable("prepared for other threads");
  }
  c->loop.elastic.warmed_samples = warmed;
  return prepared;
}

}  // namespace

int RunTrainMain(int argc, char** argv) {
  const int64_t start_micros = Clock::Real()->NowMicros();
  Config c;
  po::options_description desc = Flags(&c);
  ParsedFlags parsed;
  Status s = ParseFlags("train",
                        "usage: edl train [flags]\nTrains a ResNet: elastic (or restart mode) "
                        "under an edl client, static under `edl launch`, else standalone; the "
                        "runtime picks the mode from the environment.",
                        desc, argc, argv, &parsed);
  if (!s.ok()) {
    std::cerr << "edl train: " << s.ToString() << "\n";
    return 2;
  }
  if (parsed.help) return 0;
  if (s = Validate(c); !s.ok()) return Fail(s);
  if (s = Finish(&c); !s.ok()) return Fail(s);
  // The runtime reads the env contract and picks the mode; a bad environment fails before the
  // data is loaded.
  auto plan = runtime::ReadRunPlanFromProcess();
  if (!plan.ok()) return Fail(plan.status());
  StatusOr<std::unique_ptr<Trainer>> trainer{Status::Unavailable("not built")};
  Datasets ahead;  // a host spare's
  const bool was_spare = plan.value().spare();
  if (was_spare) {
    // A warm spare: everything that does not depend on the identity, then the wait. Its life as a
    // trainer (time to ready) begins at the assignment.
    bool released = false;
    trainer = PrepareSpare(&c, &plan.value(), &released, &ahead);
    if (released) return 0;
    if (!trainer.ok() && trainer.status().code() != Status::Code::kUnavailable)
      return Fail(trainer.status());
  }
  plan.value().ApplyTo(&c.loop.elastic);
  c.loop.elastic.start_micros = was_spare ? Clock::Real()->NowMicros() : start_micros;
  c.trainer.trainers_on_node = plan.value().env.TrainersOnNode();
  c.trainer.device_hint = plan.value().env.DeviceHint();
  if (!trainer.ok()) trainer = MakeTrainer(c, &ahead);
  if (!trainer.ok()) return Fail(trainer.status());
  Trainer* t = trainer.value().get();
  c.loop.threads = t->threads();
  c.loop.elastic.cuda_device = t->cuda_device();  // the communicator's GPU is the model's
  // --comm, now that the device is known (--device auto). A CPU trainer never asks about NCCL,
  // which would load the CUDA plugin.
  auto comm = runtime::SelectCommBackend(c.comm, t->on_device(),
                                         t->on_device() && runtime::NcclAvailable());
  if (!comm.ok()) return Fail(comm.status());
  c.loop.elastic.backend = comm.value();
  auto membership = runtime::Connect(plan.value());
  if (!membership.ok()) return Fail(membership.status());
  // After the membership: under a client, the teacher list comes over its channel (declared after
  // the membership, the teacher source is destroyed first).
  auto teacher = SetUpDistillation(c.distill, c.data, c.trainer.seed, c.batch(), t,
                                   membership.value()->service_feed());
  if (!teacher.ok()) return Fail(teacher.status());
  // What every member must share: a joiner started with another command line (batch, data, seed,
  // model) is refused by the server instead of breaking the ring.
  c.loop.elastic.config_fingerprint =
      "model=" + t->Fingerprint() + ";seed=" + std::to_string(c.trainer.seed) +
      ";train=" + std::to_string(t->train_size()) + ";batch=" + std::to_string(c.batch()) +
      ";batch_policy=" + c.batch_policy;
  std::unique_ptr<runtime::CheckpointLoader> loader;
  if (!c.store.dir.empty()) {
    c.checkpoint.config_fingerprint =
        "seed=" + std::to_string(c.trainer.seed) + ";train=" + std::to_string(t->train_size());
    loader = runtime::NewRocksDbCheckpointLoader(c.store, c.checkpoint);
    c.loop.elastic.loader = loader.get();
  }
  std::cout << "edl train: " << c.model() << " on " << t->train_data().name() << " ("
            << t->train_size() << " train / " << t->test_size() << " test, "
            << t->model()->num_params() << " parameters), device " << t->backend()->name()
            << (t->cuda_device() >= 0 ? " " + std::to_string(t->cuda_device()) : std::string())
            << ", comm " << c.loop.elastic.backend << ", threads " << t->threads() << ", batch "
            << c.batch() << " (" << c.batch_policy << "), "
            << runtime::RunModeName(plan.value().mode) << " mode, trainer "
            << membership.value()->trainer_id() << (plan.value().joining() ? " (joining)" : "")
            << std::endl;
  LoopResult result;
  s = c.plain_allreduce ? RunPlainAllReduce(t, c.loop, membership.value().get(), std::cout, &result)
                        : RunTraining(t, c.loop, membership.value().get(), std::cout, &result);
  if (teacher.value()) {
    // Every sample this process trained either had teacher logits or was counted as a fallback.
    std::cout << "edl train: distill " << teacher.value()->CountersLine() << " teacher_top1="
              << (t->teacher_rows() > 0 ? 100.0 * t->teacher_hits() / t->teacher_rows() : 0.0)
              << "% of " << t->teacher_rows() << std::endl;
  }
  if (!s.ok()) return Fail(s, s.code() == Status::Code::kInvalidArgument ? 2 : 1);
  if (t->skipped_samples() > 0) {
    std::cout << "data: " << t->skipped_samples() << " training samples skipped as unreadable by "
              << "this trainer (each file is named in a warning)" << std::endl;
  }
  if (result.skipped > 0) {
    std::cout << "data: " << result.skipped << " training samples skipped as unreadable by all "
              << "ranks together, in the steps this trainer took part in" << std::endl;
  }
  AppendUsage(c, membership.value()->trainer_id(), result);
  return 0;
}

}  // namespace edl::resnet50
