#include "resnet50/distill_main.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "edl/ckpt/checkpoint_store.h"
#include "edl/net/auth.h"
#include "edl/runtime/teacher_client.h"

namespace edl::resnet50 {

void AddDistillFlags(po::options_description* desc, DistillFlags* d) {
  desc->add_options()(
      "distill", po::value(&d->service)->default_value(""),
      "distil from the teachers of this service (`edl teacher --service NAME`); empty = off")(
      "distill_temperature", po::value(&d->loss.temperature)->default_value(4.0f, "4"),
      "T: loss = A*CE(labels) + (1-A)*T^2*KL(teacher_T || student_T)")(
      "distill_alpha", po::value(&d->loss.alpha)->default_value(0.5f, "0.5"), "A, in [0, 1]")(
      "distill_server", po::value(&d->server)->default_value(""),
      "HOST:PORT of the edl server the teachers register with (their list follows it); "
      "not needed under `edl client`, which relays the list")(
      "distill_teachers", po::value(&d->teachers)->default_value(""),
      "HOST:PORT,... of teachers, when they run without a server")(
      "secret_file", po::value(&d->secret_file)->default_value(""),
      "cluster secret for the teachers and --distill_server (default $HOME/.edl/secret)")(
      "distill_top_k", po::value(&d->top_k)->default_value(0),
      "ask for the k largest teacher logits per sample (less traffic); 0 = all")(
      "distill_window", po::value(&d->window)->default_value(8),
      "steps whose logits are asked ahead")(
      "distill_wait_s", po::value(&d->answer_wait_s)->default_value(2, "2"),
      "longest a step waits for its teacher answers; then its samples use labels only (counted)")(
      "distill_resend_s", po::value(&d->resend_after_s)->default_value(1, "1"),
      "a request unanswered this long goes to another teacher")(
      "distill_discovery_s", po::value(&d->discovery_wait_s)->default_value(30, "30"),
      "fail when no teacher of the service appears within this long (an unknown service)")(
      "distill_local", po::value(&d->local_checkpoint)->default_value(""),
      "baseline: run the teacher from this checkpoint store inside this process")(
      "distill_local_model", po::value(&d->local_model)->default_value("resnet56"),
      "--distill_local's model");
}

Status ValidateDistillFlags(const DistillFlags& d) {
  if (d.service.empty() && d.local_checkpoint.empty()) return Status::OK();
  if (!d.service.empty() && !d.local_checkpoint.empty()) {
    return Status::InvalidArgument("--distill and --distill_local exclude each other");
  }
  EDL_RETURN_IF_ERROR(ValidateDistillLossParams(d.loss));
  if (d.window < 1 || d.window > 64)
    return Status::InvalidArgument("--distill_window must be in 1..64");
  if (d.top_k < 0) return Status::InvalidArgument("--distill_top_k must be >= 0");
  if (!(d.answer_wait_s > 0) || !(d.resend_after_s > 0) || !(d.discovery_wait_s > 0)) {
    return Status::InvalidArgument(
        "--distill_wait_s, --distill_resend_s and --distill_discovery_s must be > 0");
  }
  return Status::OK();
}

namespace {

// "resnet56:1x28:10" of a fingerprint "resnet56:1x28:10:<hex>[;...]".
std::string ModelPart(const std::string& fp) {
  const std::string head = fp.substr(0, fp.find(';'));
  const size_t last = head.rfind(':');
  return last == std::string::npos ? head : head.substr(0, last);
}

// The teacher in the student's process: the benchmark's "teacher and student on the same
// machine" baseline. Get runs the teacher's forward on the spot.
class LocalTeacher : public runtime::TeacherSource {
 public:
  LocalTeacher(std::unique_ptr<Trainer> teacher, Augment augment)
      : teacher_(std::move(teacher)), augment_(augment) {}
  void Request(const std::vector<int64_t>&, uint64_t) override {}
  Status Get(const std::vector<int64_t>& indices, uint64_t aug_seed, int classes, float* logits,
             uint8_t* has) override {
    Trainer::TrainBatch b;
    b.indices = &indices;
    b.aug_seed = aug_seed;
    b.augment = augment_;
    EDL_RETURN_IF_ERROR(teacher_->InferTrain({b}, &out_));
    if (out_.size() != indices.size() * static_cast<size_t>(classes)) {
      return Status::FailedPrecondition("the local teacher's model has " +
                                        std::to_string(out_.size() / indices.size()) +
                                        " classes, the student's data " + std::to_string(classes));
    }
    std::copy(out_.begin(), out_.end(), logits);
    std::fill(has, has + indices.size(), uint8_t{1});
    counters_.answered += static_cast<int64_t>(indices.size());
    counters_.requests++;
    return Status::OK();
  }
  runtime::TeacherCounters counters() const override { return counters_; }

 private:
  const std::unique_ptr<Trainer> teacher_;
  const Augment augment_;
  std::vector<float> out_;
  runtime::TeacherCounters counters_;
};

}  // namespace

StatusOr<std::unique_ptr<Trainer>> LoadTeacherModel(const TeacherModelOptions& o) {
  if (o.checkpoint_dir.empty()) return Status::InvalidArgument("--checkpoint_dir is required");
  std::unique_ptr<Dataset> train, test;
  EDL_RETURN_IF_ERROR(LoadData(o.data, o.model, o.batch, o.seed, false, &train, &test));
  TrainerOptions to;
  to.device = o.device;
  to.threads = o.threads;
  to.model.name = o.model;
  to.seed = o.seed;
  auto t = Trainer::Create(to, std::move(train), nullptr);
  if (!t.ok()) return t.status();
  Trainer* teacher = t.value().get();
  ckpt::RocksDbStoreOptions so;
  so.dir = o.checkpoint_dir;
  std::unique_ptr<ckpt::CheckpointStore> store = ckpt::OpenRocksDbStore(so);
  ckpt::LoadedCheckpoint cp;
  Status s = store->LoadLatest("", &cp);
  if (!s.ok()) {
    return s.WithContext("teacher checkpoint " + o.checkpoint_dir +
                         " (train one with `edl train --model " + o.model +
                         " --checkpoint_dir DIR`)");
  }
  const std::string want = teacher->Fingerprint();
  const std::string have = cp.meta.fingerprint.substr(0, cp.meta.fingerprint.find(';'));
  if (have != want) {
    return Status::FailedPrecondition(
        "teacher checkpoint " + o.checkpoint_dir + " holds model " + ModelPart(have) +
        " (model:channels x size:classes), but --model " + o.model + " on " +
        teacher->train_data().name() + " makes " + ModelPart(want) +
        ": the teacher must be trained on the students' dataset (same classes and image size) "
        "with the same --model");
  }
  for (const runtime::StateTensor& st : teacher->StateTensors()) {
    const ckpt::TensorRecord* rec = cp.meta.FindTensor(st.name);
    const uint8_t* bytes = cp.Find(st.name);
    if (rec == nullptr || bytes == nullptr || rec->bytes != st.bytes) {
      return Status::Corruption("teacher checkpoint " + o.checkpoint_dir + " (id " +
                                std::to_string(cp.meta.id) + ") lacks tensor '" + st.name + "'");
    }
    EDL_RETURN_IF_ERROR(teacher->CopyFromHost(st, bytes));
  }
  LOG(INFO) << "teacher: loaded checkpoint " << cp.meta.id << " (step " << cp.meta.step << ") of "
            << ModelPart(want) << " from " << o.checkpoint_dir;
  return t;
}

StatusOr<std::unique_ptr<runtime::TeacherSource>> SetUpDistillation(const DistillFlags& d,
                                                                    const DataFlags& data,
                                                                    uint64_t seed, int64_t batch,
                                                                    Trainer* student,
                                                                    runtime::ServiceFeed* feed) {
  std::unique_ptr<runtime::TeacherSource> source;
  const Augment& aug = student->options().augment;
  if (!d.local_checkpoint.empty()) {
    TeacherModelOptions to;
    to.model = d.local_model;
    to.data = data;
    to.seed = seed;
    to.batch = batch;
    to.checkpoint_dir = d.local_checkpoint;
    to.device = student->options().device;
    to.threads = student->threads();
    auto t = LoadTeacherModel(to);
    if (!t.ok()) return t.status();
    source = std::make_unique<LocalTeacher>(std::move(t.value()), aug);
  } else if (!d.service.empty()) {
    runtime::TeacherClientOptions co;
    co.service = d.service;
    co.server = d.server;
    std::stringstream ss(d.teachers);
    for (std::string item; std::getline(ss, item, ',');) {
      if (!item.empty()) co.teachers.push_back(item);
    }
    if (co.server.empty() && co.teachers.empty()) co.feed = feed;
    EDL_RETURN_IF_ERROR(net::ReadSecretFile(
        d.secret_file.empty() ? net::DefaultSecretFile() : d.secret_file, &co.secret));
    co.classes = student->train_data().num_classes();
    co.random_crop = aug.random_crop;
    co.pad = aug.pad;
    co.flip = aug.flip;
    co.top_k = d.top_k;
    co.answer_wait = std::chrono::milliseconds(static_cast<int64_t>(d.answer_wait_s * 1000));
    co.resend_after = std::chrono::milliseconds(static_cast<int64_t>(d.resend_after_s * 1000));
    co.discovery_wait = std::chrono::milliseconds(static_cast<int64_t>(d.discovery_wait_s * 1000));
    auto c = runtime::TeacherClient::Create(co);
    if (!c.ok()) return c.status();
    source = std::move(c.value());
  } else {
    return source;
  }
  student->SetTeacher(source.get(), d.loss, d.window);
  return source;
}

}  // namespace edl::resnet50
