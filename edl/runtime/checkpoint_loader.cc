#include "edl/runtime/checkpoint_loader.h"

#include <glog/logging.h>

namespace edl::runtime {

CheckpointLoader::CheckpointLoader(std::unique_ptr<ckpt::CheckpointStore> store,
                                   CheckpointLoaderOptions options)
    : store_(std::move(store)),
      options_(std::move(options)),
      checkpointer_(store_.get(), options_.save) {}

CheckpointLoader::~CheckpointLoader() = default;

std::string CheckpointLoader::Fingerprint(Trainable* trainable) const {
  return trainable->Fingerprint() + ";" + options_.config_fingerprint;
}

std::vector<ckpt::TensorView> CheckpointLoader::Views(Trainable* trainable,
                                                      std::vector<StateTensor>* tensors) const {
  *tensors = trainable->StateTensors();
  std::vector<ckpt::TensorView> views;
  views.reserve(tensors->size());
  for (const StateTensor& t : *tensors) {
    views.push_back({t.name, t.dtype, t.shape, nullptr, t.bytes});
  }
  return views;
}

ckpt::CheckpointMeta CheckpointLoader::Meta(Trainable* trainable, const TrainingState& state,
                                            const StepContext& ctx) const {
  ckpt::CheckpointMeta m;
  EncodeCheckpointMeta(state, &m);
  m.generation = ctx.generation;
  m.world_size = ctx.world_size;
  m.fingerprint = Fingerprint(trainable);
  return m;
}

Status CheckpointLoader::Load(Trainable* trainable, TrainingState* state) {
  ckpt::LoadedCheckpoint cp;
  EDL_RETURN_IF_ERROR(store_->LoadLatest(Fingerprint(trainable), &cp));
  TrainingState loaded;  // decoded before any tensor is touched: a bad record changes nothing
  EDL_RETURN_IF_ERROR(DecodeCheckpointMeta(cp.meta, &loaded).WithContext(store_->Describe()));
  for (const StateTensor& t : trainable->StateTensors()) {
    const ckpt::TensorRecord* rec = cp.meta.FindTensor(t.name);
    const uint8_t* bytes = cp.Find(t.name);
    if (rec == nullptr || bytes == nullptr || rec->bytes != t.bytes) {
      return Status::Corruption(store_->Describe() + ": checkpoint " + std::to_string(cp.meta.id) +
                                " lacks tensor '" + t.name + "' of " + std::to_string(t.bytes) +
                                " bytes although its fingerprint matches");
    }
    EDL_RETURN_IF_ERROR(trainable->CopyFromHost(t, bytes));
  }
  *state = loaded;
  last_saved_step_ = cp.meta.step;
  LOG(INFO) << "loaded checkpoint " << cp.meta.id << " (step " << cp.meta.step << ", generation "
            << cp.meta.generation << ") from " << store_->Describe();
  return Status::OK();
}

Status CheckpointLoader::AfterStep(Trainable* trainable, const TrainingState& state,
                                   const StepContext& ctx) {
  if (!checkpointer_.Due(state.step)) return Status::OK();
  std::vector<StateTensor> tensors;
  std::vector<ckpt::TensorView> views = Views(trainable, &tensors);
  auto copy = [trainable, &tensors](size_t i, void* dst) {
    return trainable->CopyToHost(tensors[i], dst);
  };
  if (checkpointer_.MaybeSave(Meta(trainable, state, ctx), views, copy)) {
    last_saved_step_ = state.step;
  }
  return Status::OK();  // save errors are kept in last_status() and logged, never fatal
}

Status CheckpointLoader::Finish(Trainable* trainable, const TrainingState& state,
                                const StepContext& ctx) {
  if (!options_.final_save || state.step == last_saved_step_) {
    return checkpointer_.WaitIdle(std::chrono::minutes(10));
  }
  std::vector<StateTensor> tensors;
  std::vector<ckpt::TensorView> views = Views(trainable, &tensors);
  auto copy = [trainable, &tensors](size_t i, void* dst) {
    return trainable->CopyToHost(tensors[i], dst);
  };
  Status s = checkpointer_.SaveNow(Meta(trainable, state, ctx), views, copy);
  if (s.ok()) last_saved_step_ = state.step;
  return s.WithContext("final checkpoint to " + store_->Describe());
}

std::vector<nlohmann::json> CheckpointLoader::TakeEvents() {
  std::vector<nlohmann::json> out;
  const int64_t done = checkpointer_.saves_completed();
  if (done != saves_reported_) {  // the server counts them (jobserver/http/metrics.h)
    out.push_back(
        {{"event", "checkpoint_saved"},
         {"ok", true},
         {"saves", done - saves_reported_},
         {"seconds", checkpointer_.last_snapshot_seconds() + checkpointer_.last_write_seconds()}});
    saves_reported_ = done;
  }
  const int64_t failed = checkpointer_.saves_failed();
  if (failed != reported_failures_) {
    out.push_back(CheckpointFailedEvent(checkpointer_.last_failure(),
                                        checkpointer_.last_failed_step(),
                                        failed - reported_failures_, failed, store_->Describe()));
    reported_failures_ = failed;
  }
  return out;
}

nlohmann::json CheckpointFailedEvent(const Status& failure, int64_t step, int64_t failed,
                                     int64_t failed_total, const std::string& store) {
  constexpr size_t kMaxError = 1024;  // the event stays well under the server's 4 KiB bound
  std::string error = failure.message();
  if (error.size() > kMaxError) {
    size_t cut = kMaxError - 3;
    while (cut > 0 && (static_cast<unsigned char>(error[cut]) & 0xC0) == 0x80) --cut;  // UTF-8
    error = error.substr(0, cut) + "...";
  }
  return {{"event", "checkpoint_failed"},
          {"step", step},
          {"refused", failure.code() == Status::Code::kFailedPrecondition},
          {"code", Status::CodeName(failure.code())},
          {"error", error},
          {"failed", failed},
          {"failed_total", failed_total},
          {"store", store}};
}

std::unique_ptr<CheckpointLoader> NewRocksDbCheckpointLoader(const ckpt::RocksDbStoreOptions& store,
                                                             CheckpointLoaderOptions options) {
  return std::make_unique<CheckpointLoader>(ckpt::OpenRocksDbStore(store), std::move(options));
}

}  // namespace edl::runtime
