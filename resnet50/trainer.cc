#include "resnet50/trainer.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <thread>
#include <utility>

namespace edl::resnet50 {

int DefaultThreads(int trainers_on_node) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, std::max(cores, 1) / std::max(trainers_on_node, 1));
}

Trainer::Trainer(const TrainerOptions& options, std::unique_ptr<Dataset> train,
                 std::unique_ptr<Dataset> test)
    : options_(options), train_(std::move(train)), test_(std::move(test)) {}

Trainer::~Trainer() = default;

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options,
                                                   std::unique_ptr<Dataset> train,
                                                   std::unique_ptr<Dataset> test) {
  if (train == nullptr || train->size() == 0) {
    return Status::InvalidArgument("the training set is empty");
  }
  std::unique_ptr<Trainer> t(new Trainer(options, std::move(train), std::move(test)));
  EDL_RETURN_IF_ERROR(t->Init());
  return t;
}

Status Trainer::Init() {
  threads_ = options_.threads > 0 ? options_.threads : DefaultThreads(options_.trainers_on_node);
  BackendOptions bo;
  bo.threads = threads_;
  bo.precision = options_.precision;
  bo.cuda_device = options_.cuda_device;
  bo.device_hint = options_.device_hint;
  std::string device = options_.device;
  if (device == "auto") {
    auto cuda = CreateBackend("cuda", bo);
    // A bad --cuda_device is the user's error, not "no GPU here": it does not fall back to the CPU.
    if (cuda.status().code() == Status::Code::kInvalidArgument) return cuda.status();
    if (cuda.ok()) backend_ = std::move(cuda.value());
    device = "cpu";
  }
  if (!backend_) {
    auto be = CreateBackend(device, bo);
    if (!be.ok()) return be.status();
    backend_ = std::move(be.value());
  }
  ModelConfig mc = options_.model;
  mc.in_channels = train_->channels();
  mc.image_size = train_->image_size();
  mc.num_classes = train_->num_classes();
  mc.seed = options_.seed;
  auto model = Model::Create(backend_.get(), mc);
  if (!model.ok()) return model.status();
  model_ = std::move(model.value());
  momentum_ = Tensor(backend_.get(), {model_->num_params()});
  if (!momentum_.ok()) return Status::Internal("out of memory for the momentum buffers");
  EDL_RETURN_IF_ERROR(backend_->Fill(&momentum_, 0.f));

  train_loader_ = std::make_unique<BatchLoader>(train_.get(), options_.augment, options_.seed);
  if (test_) test_loader_ = std::make_unique<BatchLoader>(test_.get(), Augment{}, options_.seed);

  // State tensors: parameters, BN running statistics, momentum buffers.
  auto add = [&](const std::string& name, const Shape& shape, void* data, bool per_rank = false) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    state_.push_back({name, shape, runtime::DataType::kFloat32, data, n * sizeof(float), per_rank});
  };
  float* p = model_->params().data();
  for (const Model::ParamInfo& info : model_->param_info())
    add(info.name, info.shape, p + info.offset);
  // BN running statistics follow each rank's own batches (as in PyTorch DDP): per rank.
  for (const Model::BufferInfo& b : model_->buffers()) {
    add(b.name, b.tensor->shape(), b.tensor->raw(), /*per_rank=*/true);
  }
  float* m = momentum_.data();
  for (const Model::ParamInfo& info : model_->param_info()) {
    add("momentum/" + info.name, info.shape, m + info.offset);
  }
  return Status::OK();
}

std::vector<runtime::StateTensor> Trainer::StateTensors() { return state_; }

float* Trainer::GradientBuffer(size_t* count) {
  *count = static_cast<size_t>(model_->num_params());
  return model_->grads().data();
}

Status Trainer::ScaleGradients(float factor) {
  return backend_->Scale(&model_->grads(), factor, 0, model_->num_params());
}

void Trainer::Prefetch(int64_t epoch, const std::vector<int64_t>& indices) {
  if (options_.resident_batch && resident_loaded_) return;  // the batch is on the device already
  train_loader_->Prefetch(epoch, indices);
}

void Trainer::SetTeacher(runtime::TeacherSource* teacher, const DistillLossParams& params,
                         int window) {
  teacher_ = teacher;
  distill_ = params;
  distill_.label_smoothing = options_.label_smoothing;
  window_ = std::max(1, window);
}

void Trainer::Lookahead(const std::vector<UpcomingStep>& steps) {
  if (teacher_ == nullptr) return;
  // Teacher requests only: the data loader is left as without distillation, so a distilled run
  // and a plain one differ by the teacher's cost alone (bench/distill.sh). Each step's own epoch
  // seeds its augmentation: Get() of the next epoch's first steps must find these requests.
  for (const UpcomingStep& s : steps) {
    if (!s.indices.empty()) teacher_->Request(s.indices, train_loader_->AugSeed(s.epoch));
  }
}

Status Trainer::InferTrain(const std::vector<TrainBatch>& batches, std::vector<float>* logits) {
  int64_t n = 0;
  for (const TrainBatch& b : batches) n += static_cast<int64_t>(b.indices->size());
  if (n == 0) return Status::InvalidArgument("InferTrain: no samples");
  const int64_t per =
      static_cast<int64_t>(train_->channels()) * train_->image_size() * train_->image_size();
  HostBatch all;
  all.images.resize(static_cast<size_t>(n * per));
  all.labels.resize(static_cast<size_t>(n));
  all.indices.resize(static_cast<size_t>(n));
  int64_t at = 0;
  for (const TrainBatch& b : batches) {
    EDL_RETURN_IF_ERROR(train_->FillBatch(*b.indices, b.augment, b.aug_seed,
                                          all.images.data() + at * per, all.labels.data() + at));
    at += static_cast<int64_t>(b.indices->size());
  }
  int64_t fed = 0;
  EDL_RETURN_IF_ERROR(Upload(all, &fed));
  if (fed != n) {
    return Status::InvalidArgument("InferTrain: " + std::to_string(n - fed) +
                                   " samples could not be loaded; a teacher needs every sample");
  }
  const Tensor* out = nullptr;
  EDL_RETURN_IF_ERROR(model_->Forward(input_, /*training=*/false, &out));
  logits->resize(static_cast<size_t>(n * train_->num_classes()));
  return backend_->CopyToHost(*out, logits->data());
}

// The distillation loss on host memory (resnet50/distill_loss.h): logits down, dlogits up.
Status Trainer::DistillStep(const std::vector<int64_t>& indices, const Tensor& logits,
                            double* loss_sum, int64_t* correct) {
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t m = train_->num_classes();
  if (fed_labels_.size() != indices.size() ||
      std::find(fed_labels_.begin(), fed_labels_.end(), kSkippedLabel) != fed_labels_.end()) {
    return Status::FailedPrecondition(
        "distillation needs every sample of a batch, and this batch has unreadable ones "
        "(--data imagefolder skips them); distil from a data set without broken files");
  }
  host_logits_.resize(static_cast<size_t>(n * m));
  host_teacher_.resize(host_logits_.size());
  host_dlogits_.resize(host_logits_.size());
  has_teacher_.resize(static_cast<size_t>(n));
  EDL_RETURN_IF_ERROR(backend_->CopyToHost(logits, host_logits_.data()));
  EDL_RETURN_IF_ERROR(teacher_->Get(indices, train_loader_->AugSeed(epoch_), static_cast<int>(m),
                                    host_teacher_.data(), has_teacher_.data()));
  for (int64_t i = 0; i < n; ++i) {
    if (has_teacher_[i] == 0) continue;
    const float* row = host_teacher_.data() + i * m;
    teacher_hits_ += std::max_element(row, row + m) - row == fed_labels_[i];
    teacher_rows_++;
  }
  EDL_RETURN_IF_ERROR(DistillLoss(
      distill_, host_logits_.data(), fed_labels_.data(), host_teacher_.data(), has_teacher_.data(),
      n, m, 1.f / static_cast<float>(n), host_dlogits_.data(), loss_sum, correct));
  return backend_->CopyFromHost(host_dlogits_.data(), &dlogits_);
}

void Trainer::SetEpoch(int64_t epoch) {
  if (epoch != epoch_ && skipped_epoch_ > 0) {
    LOG(WARNING) << "epoch " << epoch_ + 1 << ": " << skipped_epoch_ << " of " << loaded_epoch_
                 << " training samples this trainer loaded were skipped as unreadable (each "
                    "file is named in an earlier warning)";
  }
  if (epoch != epoch_) skipped_epoch_ = loaded_epoch_ = 0;
  epoch_ = epoch;
}

Status Trainer::Upload(const HostBatch& full, int64_t* fed) {
  const HostBatch* batch = &full;
  const int64_t skipped = full.skipped();
  if (skipped > 0) {  // keep the loaded samples only
    const size_t per = full.images.size() / std::max<size_t>(full.labels.size(), 1);
    compact_.images.clear();
    compact_.labels.clear();
    for (size_t i = 0; i < full.labels.size(); ++i) {
      if (full.labels[i] == kSkippedLabel) continue;
      compact_.labels.push_back(full.labels[i]);
      compact_.images.insert(compact_.images.end(), full.images.begin() + i * per,
                             full.images.begin() + (i + 1) * per);
    }
    batch = &compact_;
  }
  const int64_t n = static_cast<int64_t>(batch->labels.size());
  *fed = n;
  if (n == 0) return Status::OK();
  const int64_t s = train_->image_size();
  if (input_.rank() == 0 || input_.dim(0) != n) {
    input_ = Tensor(backend_.get(), {n, train_->channels(), s, s});
    labels_ = Tensor(backend_.get(), {n}, Layout::kNCHW, DataType::kInt32);
    dlogits_ = Tensor(backend_.get(), {n, train_->num_classes()});
    if (!input_.ok() || !dlogits_.ok()) return Status::Internal("out of memory for the batch");
  }
  EDL_RETURN_IF_ERROR(backend_->CopyFromHost(batch->images.data(), &input_));
  return backend_->CopyFromHost(batch->labels.data(), &labels_);
}

Status Trainer::ForwardBackward(const std::vector<int64_t>& indices, runtime::StepStats* stats) {
  if (indices.empty()) return Status::InvalidArgument("ForwardBackward: empty batch");
  const int64_t n = static_cast<int64_t>(indices.size());
  int64_t fed = n;
  if (!options_.resident_batch || !resident_loaded_ || input_.dim(0) != n) {
    EDL_RETURN_IF_ERROR(train_loader_->Get(epoch_, indices, &batch_));
    EDL_RETURN_IF_ERROR(Upload(batch_, &fed));
    skipped_epoch_ += n - fed;
    skipped_total_ += n - fed;
    loaded_epoch_ += n;
    // The labels as the loss will read them (back from the uploaded tensor), for the sample log;
    // a skipped sample shows as kSkippedLabel in its place.
    fed_labels_.resize(static_cast<size_t>(fed));
    if (fed > 0) EDL_RETURN_IF_ERROR(backend_->CopyToHost(labels_, fed_labels_.data()));
    if (fed < n) {
      std::vector<int32_t> all(batch_.labels);
      for (size_t i = 0, j = 0; i < all.size(); ++i) {
        if (all[i] != kSkippedLabel) all[i] = fed_labels_[j++];
      }
      fed_labels_ = std::move(all);
    }
    resident_loaded_ = fed == n;
  } else {
    backend_->MarkResidentStep();
  }
  stats->label_hash = runtime::LabelHash(fed_labels_.data(), fed_labels_.size());
  if (fed == 0) {  // every sample unloadable: contribute nothing
    stats->samples = 0;
    return ZeroGradients();
  }
  const Tensor* logits = nullptr;
  EDL_RETURN_IF_ERROR(model_->Forward(input_, /*training=*/true, &logits));
  double loss_sum = 0;
  int64_t correct = 0;
  if (teacher_ != nullptr) {
    EDL_RETURN_IF_ERROR(DistillStep(indices, *logits, &loss_sum, &correct));
  } else {
    EDL_RETURN_IF_ERROR(backend_->SoftmaxCrossEntropy(*logits, labels_, options_.label_smoothing,
                                                      1.f / static_cast<float>(n), &dlogits_,
                                                      &loss_sum, &correct));
  }
  EDL_RETURN_IF_ERROR(model_->Backward(dlogits_));
  // In-band slots start at zero every step; the runtime writes its words after this.
  EDL_RETURN_IF_ERROR(backend_->Scale(&model_->grads(), 0.f, model_->num_params(),
                                      runtime::Trainable::kInbandSlots));
  stats->loss_sum = loss_sum;
  stats->correct = correct;
  stats->samples = fed;
  return Status::OK();
}

Status Trainer::WarmUpStep(const std::vector<int64_t>& indices) {
  runtime::TeacherSource* const teacher = teacher_;
  const int64_t skipped_epoch = skipped_epoch_, skipped_total = skipped_total_,
                loaded_epoch = loaded_epoch_;
  teacher_ = nullptr;
  runtime::StepStats stats;
  const Status s = ForwardBackward(indices, &stats);
  teacher_ = teacher;
  skipped_epoch_ = skipped_epoch;
  skipped_total_ = skipped_total;
  loaded_epoch_ = loaded_epoch;
  return s;
}

Status Trainer::ApplyUpdate(double lr) {
  SgdParams p;
  p.lr = static_cast<float>(lr);
  p.momentum = options_.momentum;
  p.nesterov = options_.nesterov;
  p.weight_decay = options_.weight_decay;
  const int64_t decay = model_->decay_count();
  EDL_RETURN_IF_ERROR(
      backend_->SgdUpdate(p, &model_->params(), model_->grads(), &momentum_, 0, decay));
  p.weight_decay = 0.f;
  return backend_->SgdUpdate(p, &model_->params(), model_->grads(), &momentum_, decay,
                             model_->num_params() - decay);
}

Status Trainer::Evaluate(const std::vector<int64_t>& indices, runtime::StepStats* stats) {
  if (!test_loader_) return Status::FailedPrecondition("no test split loaded");
  if (indices.empty()) return Status::InvalidArgument("Evaluate: empty batch");
  HostBatch batch;
  EDL_RETURN_IF_ERROR(test_loader_->Get(0, indices, &batch));
  int64_t fed = 0;
  EDL_RETURN_IF_ERROR(Upload(batch, &fed));
  if (fed == 0) return Status::OK();  // nothing loadable: stats stay zero
  const Tensor* logits = nullptr;
  EDL_RETURN_IF_ERROR(model_->Forward(input_, /*training=*/false, &logits));
  double loss_sum = 0;
  int64_t correct = 0;
  EDL_RETURN_IF_ERROR(
      backend_->SoftmaxCrossEntropy(*logits, labels_, 0.f, 1.f, nullptr, &loss_sum, &correct));
  stats->loss_sum = loss_sum;
  stats->correct = correct;
  stats->samples = fed;
  // Top-5 from the logits on the host: the label's logit has fewer than 5 strictly greater ones.
  const int64_t classes = train_->num_classes();
  logits_host_.resize(static_cast<size_t>(fed * classes));
  EDL_RETURN_IF_ERROR(backend_->CopyToHost(*logits, logits_host_.data()));
  const std::vector<int32_t>& fed_labels = batch.skipped() > 0 ? compact_.labels : batch.labels;
  stats->correct_top5 = 0;
  for (int64_t i = 0; i < fed; ++i) {
    const float* row = &logits_host_[static_cast<size_t>(i * classes)];
    const float mine = row[fed_labels[i]];
    int64_t above = 0;
    for (int64_t k = 0; k < classes; ++k) above += row[k] > mine;
    stats->correct_top5 += above < 5;
  }
  return Status::OK();
}

std::string Trainer::StateLayout() const {
  std::ostringstream os;
  os << model_->config().name << ":" << model_->config().in_channels << "x"
     << model_->config().image_size << ":" << model_->config().num_classes;
  for (const runtime::StateTensor& t : state_) {
    os << ";" << t.name << "[";
    for (size_t i = 0; i < t.shape.size(); ++i) os << (i ? "," : "") << t.shape[i];
    os << "]";
  }
  return os.str();
}

std::string Trainer::Fingerprint() const {
  // FNV-1a (64 bit) of the layout: short enough for `edl ckpt ls`, and any change of a tensor's
  // name or shape changes it.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : StateLayout()) h = (h ^ c) * 0x100000001b3ULL;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  std::ostringstream os;
  os << model_->config().name << ":" << model_->config().in_channels << "x"
     << model_->config().image_size << ":" << model_->config().num_classes << ":" << hex;
  return os.str();
}

Status Trainer::CopyToHost(const runtime::StateTensor& t, void* dst) {
  Tensor view = Tensor::View(backend_.get(), t.data, {static_cast<int64_t>(t.bytes / 4)});
  return backend_->CopyToHost(view, dst);
}

Status Trainer::CopyFromHost(const runtime::StateTensor& t, const void* src) {
  Tensor view = Tensor::View(backend_.get(), t.data, {static_cast<int64_t>(t.bytes / 4)});
  return backend_->CopyFromHost(src, &view);
}

}  // namespace edl::resnet50
