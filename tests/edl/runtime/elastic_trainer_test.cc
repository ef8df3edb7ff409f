// The elastic loop with ranks as threads: a small deterministic Trainable (linear regression with
// momentum on synthetic data) and an in-process membership fake standing in for the control
// plane. Scenario: 4 -> 2 (script shrink) -> 3 (hot join) -> 2 (one trainer fails mid-step).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "edl/ckpt/checkpoint_store.h"
#include "edl/proto/rendezvous_key.h"
#include "edl/runtime/checkpoint_loader.h"
#include "edl/runtime/comm/file_kv_store.h"
#include "edl/runtime/comm/memory_kv_store.h"
#include "edl/runtime/elastic_trainer.h"
#include "tests/edl/runtime/sample_log_check.h"
#include "tests/edl/runtime/stall_check.h"
#include "tests/testutil.h"

namespace edl::runtime {
namespace {

using std::chrono::milliseconds;

// ---------------------------------------------------------------------------------------------
// Linear regression y = w.x + b with SGD + momentum. Samples are a pure function of the index.

constexpr int kDim = 6;

class LinearModel : public Trainable {
 public:
  LinearModel(int64_t train, int64_t test, uint64_t init_seed) : train_(train), test_(test) {
    for (int i = 0; i < kDim + 1; ++i) params_[i] = static_cast<float>(Noise(init_seed * 131 + i));
  }
  bool on_device() const override { return false; }
  std::vector<StateTensor> StateTensors() override {
    return {{"w", {kDim}, DataType::kFloat32, params_, kDim * 4},
            {"b", {1}, DataType::kFloat32, params_ + kDim, 4},
            {"momentum", {kDim + 1}, DataType::kFloat32, momentum_, (kDim + 1) * 4}};
  }
  float* GradientBuffer(size_t* count) override {
    *count = kDim + 1;
    return grad_;
  }
  Status ScaleGradients(float f) override {
    for (int i = 0; i < kDim + 1; ++i) grad_[i] *= f;
    return Status::OK();
  }
  int64_t train_size() const override { return train_; }
  int64_t test_size() const override { return test_; }
  void Prefetch(int64_t epoch, const std::vector<int64_t>& idx) override {
    hints_.insert({epoch, idx});
  }
  void SetEpoch(int64_t epoch) override { epoch_ = epoch; }
  Status ForwardBackward(const std::vector<int64_t>& idx, StepStats* st) override {
    if (fail_next_) return Status::Internal("injected trainer crash");
    prefetch_hits_ += hints_.count({epoch_, idx});
    std::fill(grad_, grad_ + kDim + 1, 0.0f);
    std::vector<int32_t> labels;
    for (int64_t i : idx) {
      Accumulate(i, 1.0f / idx.size(), st);
      labels.push_back(Label(i));
    }
    st->label_hash = LabelHash(labels.data(), labels.size());
    return Status::OK();
  }
  Status ApplyUpdate(double lr) override {
    for (int i = 0; i < kDim + 1; ++i) {
      momentum_[i] = 0.9f * momentum_[i] + grad_[i];
      params_[i] -= static_cast<float>(lr) * momentum_[i];
    }
    return Status::OK();
  }
  Status Evaluate(const std::vector<int64_t>& idx, StepStats* st) override {
    float saved[kDim + 1];
    std::copy(grad_, grad_ + kDim + 1, saved);
    for (int64_t i : idx) Accumulate(train_ + i, 0, st);
    std::copy(saved, saved + kDim + 1, grad_);
    return Status::OK();
  }
  std::string Fingerprint() const override { return "linear-" + std::to_string(kDim); }
  Status CopyToHost(const StateTensor& t, void* dst) override {
    std::memcpy(dst, t.data, t.bytes);
    return Status::OK();
  }
  Status CopyFromHost(const StateTensor& t, const void* src) override {
    std::memcpy(t.data, src, t.bytes);
    return Status::OK();
  }
  std::atomic<bool> fail_next_{false};
  // Steps whose (epoch, indices) had been announced by a Prefetch.
  int64_t prefetch_hits_ = 0;
  // A class per sample, for the fed-labels check of the sample log (the regression ignores it).
  static int32_t Label(int64_t i) { return static_cast<int32_t>((i * 7) % 10); }

 private:
  static double Noise(uint64_t k) {  // deterministic in [-1, 1)
    k = (k + 0x9E3779B97F4A7C15ULL) * 0xBF58476D1CE4E5B9ULL;
    k ^= k >> 29;
    k *= 0x94D049BB133111EBULL;
    k ^= k >> 32;
    return static_cast<double>(k % 2000000) / 1e6 - 1.0;
  }
  // Adds weight * d(0.5 err^2)/d(params) of sample `i` to grad_ (weight 0: loss only).
  void Accumulate(int64_t i, float weight, StepStats* st) {
    float x[kDim], y = 0.5f, pred = params_[kDim];
    for (int k = 0; k < kDim; ++k) {
      x[k] = static_cast<float>(Noise(i * 7919 + k));
      y += (k + 1) * 0.3f * x[k];
      pred += params_[k] * x[k];
    }
    y += 0.01f * static_cast<float>(Noise(i * 31 + 5));
    const float err = pred - y;
    for (int k = 0; k < kDim; ++k) grad_[k] += weight * err * x[k];
    grad_[kDim] += weight * err;
    st->loss_sum += 0.5 * err * err;
    st->correct += std::fabs(err) < 0.1f;
    st->samples++;
  }

  const int64_t train_, test_;
  int64_t epoch_ = -1;                                        // SetEpoch
  std::set<std::pair<int64_t, std::vector<int64_t>>> hints_;  // every Prefetch
  float params_[kDim + 1];                                    // [kDim] weights, then the bias
  float momentum_[kDim + 1] = {};                             // [kDim + 1]
  float grad_[kDim + 1 + kInbandSlots] = {};
};

// ---------------------------------------------------------------------------------------------
// In-process control plane: generations, KV, readiness, progress and events.

class FakeCluster {
 public:
  int64_t Commit(std::vector<std::string> members, bool failure, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    Generation g;
    g.number = static_cast<int64_t>(gens_.size()) + 1;
    g.members = std::move(members);
    g.failure = failure;
    g.reason = reason;
    gens_.push_back(g);
    cv_.notify_all();
    return g.number;
  }
  bool Latest(Generation* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (gens_.empty()) return false;
    *out = gens_.back();
    return true;
  }
  Status WaitGeneration(int64_t after, milliseconds timeout, Generation* out) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !gens_.empty() && gens_.back().number > after; }))
      return Status::Timeout("no generation after " + std::to_string(after));
    *out = gens_.back();
    return Status::OK();
  }
  void Record(const nlohmann::json& e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
    cv_.notify_all();
  }
  void Progress(const ProgressInfo& p) {
    std::lock_guard<std::mutex> lock(mu_);
    max_step_ = std::max(max_step_, p.step);
    losses_.push_back(p.loss);
    cv_.notify_all();
  }
  void Ready(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.insert(id);
    cv_.notify_all();
  }
  // Waits (bounded) for `pred` over the cluster's state; false on timeout.
  template <typename Pred>
  bool WaitFor(Pred pred, milliseconds timeout = milliseconds(60000)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(); });
  }
  void Notify() { cv_.notify_all(); }
  // Trainers block in ReportProgress once they committed step `step` (or later) until the next
  // HoldAt moves the mark: the test commits generations at exact steps however fast they train.
  void HoldAt(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_at_ = step;
    cv_.notify_all();
  }
  void Hold(int64_t step) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, milliseconds(120000), [&] { return step < hold_at_; });
  }

  // The rendezvous store, counting writes (a rendezvous key per rank and communicator) and waking
  // WaitFor at each. A closed gate (CloseGate) holds every write under its prefix until it opens.
  class CountingKv : public KvStore {
   public:
    explicit CountingKv(FakeCluster* c) : c_(c) {}
    Status Set(const std::string& key, const std::string& value) override {
      if (Refused())
        return Status::Unavailable("the node's client is not connected to the server; retry");
      if (FailOnce()) return Status::IOError("injected: the rendezvous write failed");
      {
        std::unique_lock<std::mutex> lock(c_->mu_);
        if (!c_->gate_.empty() && key.rfind(c_->gate_, 0) == 0) {
          c_->held_at_gate_++;
          c_->cv_.notify_all();
          c_->cv_.wait_for(lock, milliseconds(120000), [&] { return c_->gate_.empty(); });
        }
      }
      Status s = kv_.Set(key, value);
      std::lock_guard<std::mutex> lock(c_->mu_);
      c_->kv_sets_++;
      c_->cv_.notify_all();
      return s;
    }
    Status Get(const std::string& key, std::string* value) override {
      if (Refused())
        return Status::Unavailable("the node's client is not connected to the server; retry");
      return kv_.Get(key, value);
    }
    Status Wait(const std::string& key, milliseconds timeout, std::string* value) override {
      if (Refused())
        return Status::Unavailable("the node's client is not connected to the server; retry");
      return kv_.Wait(key, timeout, value);
    }
    // The next Set fails with IOError (once): a rendezvous that fails with nothing newer committed.
    void FailNextSet() {
      std::lock_guard<std::mutex> lock(c_->mu_);
      fail_next_set_ = true;
    }
    // The next `n` calls answer Unavailable, as a client between server connections does.
    void Refuse(int n) {
      std::lock_guard<std::mutex> lock(c_->mu_);
      refuse_ = n;
    }
    int refused() {
      std::lock_guard<std::mutex> lock(c_->mu_);
      return refused_;
    }

   private:
    bool FailOnce() {
      std::lock_guard<std::mutex> lock(c_->mu_);
      const bool fail = fail_next_set_;
      fail_next_set_ = false;
      return fail;
    }
    bool Refused() {
      std::lock_guard<std::mutex> lock(c_->mu_);
      if (refuse_ <= 0) return false;
      --refuse_;
      ++refused_;
      return true;
    }
    FakeCluster* const c_;
    MemoryKvStore kv_;
    int refuse_ = 0, refused_ = 0;  // guarded by c_->mu_
    bool fail_next_set_ = false;    // guarded by c_->mu_
  };
  // Whether every trainer in `ids` reported generation `gen`'s communicator built ahead (a
  // "prepared" event); call with mu_ held (inside WaitFor). Members switch to a planned generation
  // only once all of them have it, so a test that needs the switch at an exact step waits for this
  // first. (A joiner's watcher may build its first communicator ahead too, racing its re-form.)
  bool BuiltAhead(int64_t gen, const std::set<std::string>& ids) const {
    std::set<std::string> built;
    for (const auto& e : events_) {
      if (e["event"] == "prepared" && e["generation"] == gen && e["ok"] == true) {
        built.insert(e["trainer"].get<std::string>());
      }
    }
    return std::includes(built.begin(), built.end(), ids.begin(), ids.end());
  }
  int64_t KvSets() {
    std::lock_guard<std::mutex> lock(mu_);
    return kv_sets_;
  }
  void CloseGate(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    gate_ = prefix;
  }
  void OpenGate() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_.clear();
    cv_.notify_all();
  }
  // Whether `trainer` reported `event` (with mu_ held).
  bool Reported(const std::string& trainer, const std::string& event) const {
    for (const auto& e : events_) {
      if (e["trainer"] == trainer && e["event"] == event) return true;
    }
    return false;
  }
  std::string gate_;      // rendezvous writes under this prefix wait (empty: none)
  int held_at_gate_ = 0;  // writes that arrived at the closed gate
  CountingKv kv{this};
  int64_t kv_sets_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Generation> gens_;
  std::vector<nlohmann::json> events_;
  std::vector<double> losses_;
  std::set<std::string> ready_;
  std::map<std::string, std::vector<double>> images_per_sec_;  // by trainer, as reported
  std::map<std::string, std::vector<double>> accuracies_;      // by trainer, as reported
  std::map<std::string, std::vector<ProgressInfo>> reports_;   // by trainer, every report
  int64_t max_step_ = 0;
  int64_t hold_at_ = INT64_MAX;
};

class FakeMembership : public MembershipSource {
 public:
  FakeMembership(FakeCluster* c, std::string id) : c_(c), id_(std::move(id)) {}
  std::string trainer_id() const override { return id_; }
  bool Latest(Generation* out) override { return c_->Latest(out); }
  Status WaitGeneration(int64_t after, milliseconds t, Generation* out) override {
    return c_->WaitGeneration(after, t, out);
  }
  KvStore* kv() override { return &c_->kv; }
  Status ReportReady(int64_t) override { return c_->Ready(id_), Status::OK(); }
  Status ReportProgress(const ProgressInfo& p) override {
    c_->Progress(p);
    {
      std::lock_guard<std::mutex> lock(c_->mu_);
      c_->images_per_sec_[id_].push_back(p.images_per_sec);
      c_->accuracies_[id_].push_back(p.accuracy);
      c_->reports_[id_].push_back(p);
    }
    c_->Hold(p.step);
    return Status::OK();
  }
  Status ReportEvent(const nlohmann::json& e) override { return c_->Record(e), Status::OK(); }

 private:
  FakeCluster* const c_;
  const std::string id_;
};

// One trainer thread with its own model, membership view and result.
struct TrainerThread {
  std::string id;
  std::unique_ptr<LinearModel> model;
  std::unique_ptr<FakeMembership> membership;
  ElasticResult result;
  Status status;
  std::atomic<bool> finished{false};
  std::thread thread;
};

constexpr int64_t kTrain = 384, kTest = 128;

ElasticOptions Options(const test::ScratchDir& dir, const std::string& id, bool joining) {
  ElasticOptions o;
  o.batch = 8;
  o.epochs = 8;
  o.lr.base_lr = 0.05;
  o.lr.base_batch = 32;
  o.lr.decay = "constant";
  o.lr.rescale_ramp_steps = 3;
  o.joining = joining;
  o.comm_timeout = milliseconds(20000);
  o.generation_wait = milliseconds(30000);
  o.progress_every = 1;
  o.evaluate_each_epoch = true;
  o.sample_log_path = dir.Join(id + ".samples");
  return o;
}

void Start(FakeCluster* cluster, const test::ScratchDir& dir, TrainerThread* t, int seed,
           bool joining, FakeCluster* notify) {
  t->model = std::make_unique<LinearModel>(kTrain, kTest, seed);
  t->membership = std::make_unique<FakeMembership>(cluster, t->id);
  const test::ScratchDir* d = &dir;
  t->thread = std::thread([=] {
    ElasticTrainer trainer(Options(*d, t->id, joining), t->model.get(), t->membership.get());
    t->status = trainer.Run(&t->result);
    t->finished = true;
    notify->Notify();
  });
}

// Every completed epoch consumed every sample exactly once, across all trainers' logs (each
// logs the global step; the union is taken by step number).
void ExpectExactlyOnce(const test::ScratchDir& dir, const std::vector<std::string>& ids,
                       int64_t epochs, int64_t failures = 0) {
  std::vector<std::string> paths;
  for (const std::string& id : ids) paths.push_back(dir.Join(id + ".samples"));
  std::map<int64_t, test::LoggedStep> steps;
  ASSERT_EQ(test::ReadSampleLogs(paths, &steps), "");
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.rbegin()->second.epoch, epochs - 1);
  EXPECT_EQ(test::CheckExactlyOnce(steps, kTrain, epochs), "");
  // And each rank fed its model exactly its planned slice, every step. Every step is confirmed
  // by all its ranks, except that an injected failure may land after one rank committed the step
  // in flight and before the others did (the step is then re-done by the next generation): at
  // most one such step per failure.
  int64_t unconfirmed = 0;
  EXPECT_EQ(test::CheckFedBatches(steps, LinearModel::Label, &unconfirmed), "");
  EXPECT_LE(unconfirmed, failures);
}

TEST(ElasticTrainerTest, ShrinkJoinAndFailureKeepRanksIdenticalAndDataExactlyOnce) {
  test::ScratchDir dir("elastic");
  FakeCluster c;
  TrainerThread t[5];
  for (int i = 0; i < 5; ++i) t[i].id = "t" + std::to_string(i);
  const auto t_begin = std::chrono::steady_clock::now();
  c.Commit({"t0", "t1", "t2", "t3"}, false, "start");
  c.HoldAt(10);
  for (int i = 0; i < 4; ++i) Start(&c, dir, &t[i], i + 1, false, &c);

  // 4 -> 2: t1 and t3 finish the switch step and leave.
  ASSERT_TRUE(c.WaitFor([&] { return c.max_step_ >= 10; }));
  // Make-before-break: while every trainer is held at step 10, the survivors' communicators for
  // generation 2 can only be built ahead, beside the training thread.
  c.Commit({"t0", "t2"}, false, "script");
  ASSERT_TRUE(c.WaitFor([&] { return c.BuiltAhead(2, {"t0", "t2"}); }));
  c.HoldAt(25);
  ASSERT_TRUE(c.WaitFor([&] { return t[1].finished && t[3].finished; }));
  // 2 -> 3: t4 prepares while the others wait at step 25, reports ready, then is committed.
  ASSERT_TRUE(c.WaitFor([&] { return c.max_step_ >= 25; }));
  Start(&c, dir, &t[4], 99, true, &c);
  ASSERT_TRUE(c.WaitFor([&] { return c.ready_.count("t4") > 0; }));
  c.Commit({"t0", "t2", "t4"}, false, "script");
  // The survivors' builds complete only with the joiner's (it builds in its own re-form).
  ASSERT_TRUE(c.WaitFor([&] { return c.BuiltAhead(3, {"t0", "t2"}); }));
  c.HoldAt(45);
  // 3 -> 2: t2 crashes inside a step; the control plane commits a failure generation.
  ASSERT_TRUE(c.WaitFor([&] { return c.max_step_ >= 45; }));
  t[2].model->fail_next_ = true;
  c.HoldAt(INT64_MAX);
  ASSERT_TRUE(c.WaitFor([&] { return t[2].finished.load(); }));
  // Each survivor whose collective failed says so before anything newer is committed: with a
  // closed client connection, that report is what lets the server commit the failure at once.
  ASSERT_TRUE(c.WaitFor([&] {
    std::set<std::string> reported;
    for (const auto& e : c.events_) {
      if (e["event"] == "comm_failed" && e["generation"] == 3)
        reported.insert(e["trainer"].get<std::string>());
    }
    return reported == std::set<std::string>{"t0", "t4"};
  }));
  c.Commit({"t0", "t4"}, true, "failure");
  for (auto& tt : t) tt.thread.join();
  const double test_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_begin).count();

  EXPECT_OK(t[0].status);
  EXPECT_OK(t[4].status);
  for (int i : {1, 3}) {
    EXPECT_OK(t[i].status);
    EXPECT_TRUE(t[i].result.left);
  }
  EXPECT_EQ(t[2].status.code(), Status::Code::kInternal) << t[2].status.ToString();
  EXPECT_FALSE(t[0].result.left);
  EXPECT_EQ(t[0].result.generation, 4);
  EXPECT_EQ(t[0].result.state_hash, t[4].result.state_hash);
  EXPECT_EQ(t[0].result.step, t[4].result.step);

  // After every re-form every member synced to the same state (a joiner included).
  std::map<int64_t, std::vector<std::string>> hashes;
  std::map<int64_t, bool> broadcast;
  int stalls = 0;
  for (const auto& e : c.events_) {
    if (e["event"] == "sync") {
      hashes[e["generation"].get<int64_t>()].push_back(e["state_hash"]);
      broadcast[e["generation"].get<int64_t>()] = e["tensors_broadcast"];
    }
    if (e["event"] == "stall") {
      ++stalls;
      // A survivor's stall: from its last step in the old generation to the end of its first step
      // in the new one (a re-form and a whole step: more than nothing, less than the whole run),
      // labelled with the change it measured.
      const int64_t g = e["generation"].get<int64_t>();
      const double stall_s = e["stall_s"].get<double>();
      EXPECT_GT(stall_s, 0) << e.dump();
      EXPECT_LT(stall_s, test_s) << e.dump();
      const int world_before[] = {0, 0, 4, 2, 3}, world_after[] = {0, 4, 2, 3, 2};
      ASSERT_TRUE(g >= 2 && g <= 4) << e.dump();
      EXPECT_EQ(e["from_generation"], g - 1) << e.dump();
      EXPECT_EQ(e["world_before"], world_before[g]) << e.dump();
      EXPECT_EQ(e["world_after"], world_after[g]) << e.dump();
      EXPECT_EQ(e["failure"], g == 4) << e.dump();
      EXPECT_EQ(test::CheckStallBreakdown(e), "");
      // The planned changes switched to a communicator built while training on the old one.
      EXPECT_EQ(e["prepared"], g != 4) << e.dump();
      std::cout << "stall " << e.dump() << "\n";
    }
  }
  ASSERT_EQ(hashes.size(), 4u);
  const size_t world[] = {4, 2, 3, 2};
  for (int64_t g = 1; g <= 4; ++g) {
    ASSERT_EQ(hashes[g].size(), world[g - 1]) << "generation " << g;
    for (const auto& h : hashes[g]) EXPECT_EQ(h, hashes[g][0]) << "generation " << g;
  }
  EXPECT_FALSE(broadcast[2]) << "a pure shrink needs no state broadcast";
  EXPECT_TRUE(broadcast[3]) << "the joiner must receive the survivors' state";
  EXPECT_GE(stalls, 3);  // t0 at each of the three switches, plus the others
  // The joiner ran its first, cold step before reporting ready, on its own batch.
  int warm_ups = 0;
  for (const auto& e : c.events_) {
    if (e["event"] == "joiner_warm_up") {
      ++warm_ups;
      EXPECT_EQ(e["trainer"], "t4") << e.dump();
      EXPECT_EQ(e["samples"], 8) << e.dump();  // --batch, fixed per rank
    }
  }
  EXPECT_EQ(warm_ups, 1);

  ExpectExactlyOnce(dir, {"t0", "t1", "t2", "t3", "t4"}, 8, /*failures=*/1);

  // Training loss fell.
  ASSERT_GT(c.losses_.size(), 20u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += c.losses_[i];
    last += c.losses_[c.losses_.size() - 1 - i];
  }
  EXPECT_LT(last, first * 0.1) << "first " << first / 5 << " last " << last / 5;
  EXPECT_GT(t[0].result.accuracy, 0.5);
}

// A loader that "restores" a checkpoint at step 7 with known parameters.
class FixedLoader : public StateLoader {
 public:
  Status Load(Trainable* t, TrainingState* state) override {
    ++loads;
    for (const StateTensor& st : t->StateTensors()) {
      std::vector<float> v(st.bytes / 4, 0.25f);
      EDL_RETURN_IF_ERROR(t->CopyFromHost(st, v.data()));
    }
    state->step = 7;
    state->position = {1, 40};
    return Status::OK();
  }
  std::atomic<int> loads{0};
};

// A max_steps no test reaches: the job trains until the test stops it (its 8 epochs of these tiny
// steps take milliseconds, so a test that waits for events before it stops the job must not let
// the job finish first).
constexpr int64_t kUntilStopped = 1000000000;

// Starts trainers "a", "b", ... (one per element of `t`) on `c`, each with its own model (seeds
// from `seed`) and `loader`, training up to `max_steps` (0: the epochs) without evaluation.
template <size_t N>
void StartWithLoader(FakeCluster* c, const test::ScratchDir& dir, StateLoader* loader, int seed,
                     int64_t max_steps, TrainerThread (&t)[N]) {
  for (size_t i = 0; i < N; ++i) {
    t[i].id = std::string(1, static_cast<char>('a' + i));
    t[i].model = std::make_unique<LinearModel>(kTrain, kTest, seed + static_cast<int>(i));
    t[i].membership = std::make_unique<FakeMembership>(c, t[i].id);
  }
  for (auto& tt : t) {
    TrainerThread* p = &tt;
    tt.thread = std::thread([&dir, loader, max_steps, p] {
      ElasticOptions o = Options(dir, p->id, false);
      o.max_steps = max_steps;
      o.evaluate_each_epoch = false;
      o.loader = loader;
      ElasticTrainer trainer(o, p->model.get(), p->membership.get());
      p->status = trainer.Run(&p->result);
    });
  }
}

TEST(ElasticTrainerTest, ColdStartLoadsOnOneRankAndBroadcasts) {
  test::ScratchDir dir("cold");
  FakeCluster c;
  FixedLoader loader;
  c.Commit({"a", "b", "c"}, false, "start");
  TrainerThread t[3];
  StartWithLoader(&c, dir, &loader, 10, 12, t);
  for (auto& tt : t) tt.thread.join();
  EXPECT_EQ(loader.loads.load(), 1);
  for (auto& tt : t) {
    EXPECT_OK(tt.status);
    EXPECT_EQ(tt.result.step, 12);
    EXPECT_EQ(tt.result.state_hash, t[0].result.state_hash);
  }
  // The first committed step after the cold start is step 8, at epoch 1.
  std::ifstream in(dir.Join("a.samples"));
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  nlohmann::json first = nlohmann::json::parse(line);
  EXPECT_EQ(first["step"], 8);
  EXPECT_EQ(first["epoch"], 1);
  EXPECT_EQ(first["idx"].size(), 3u * 8) << "the global step: every rank's slice";
}

// A loader whose background saves "finish", two at once, once rank 0 is past step 10.
class SavingLoader : public FixedLoader {
 public:
  Status AfterStep(Trainable*, const TrainingState& state, const StepContext&) override {
    step = state.step;
    return Status::OK();
  }
  std::vector<nlohmann::json> TakeEvents() override {
    if (step < 10 || reported) return {};
    reported = true;
    return {{{"event", "checkpoint_saved"}, {"ok", true}, {"saves", 2}, {"seconds", 0.5}}};
  }
  int64_t step = 0;  // rank 0's thread only
  bool reported = false;
};

TEST(ElasticTrainerTest, RankZeroReportsFinishedCheckpointSaves) {
  test::ScratchDir dir("saves");
  FakeCluster c;
  SavingLoader loader;
  c.Commit({"a", "b"}, false, "start");
  TrainerThread t[2];
  StartWithLoader(&c, dir, &loader, 10, 14, t);
  for (auto& tt : t) tt.thread.join();
  int reports = 0;
  for (const auto& e : c.events_) {
    if (e["event"] != "checkpoint_saved") continue;
    ++reports;
    EXPECT_EQ(e["trainer"], "a") << "rank 0 saves: " << e.dump();
    EXPECT_EQ(e["saves"], 2);
    EXPECT_EQ(e["seconds"], 0.5);
    EXPECT_EQ(e["ok"], true);
    EXPECT_GE(e["step"].get<int64_t>(), 10);
  }
  EXPECT_EQ(reports, 1) << "the server counts these (jobserver/http/metrics.h)";
}

// Records the final saves (Finish) it is asked for.
class FinishRecorder : public StateLoader {
 public:
  Status Load(Trainable*, TrainingState*) override { return Status::NotFound("no checkpoint"); }
  Status Finish(Trainable*, const TrainingState& state, const StepContext& ctx) override {
    std::lock_guard<std::mutex> l(mu);
    calls.push_back({state.step, ctx.rank, ctx.generation});
    return Status::OK();
  }
  std::mutex mu;
  std::vector<std::array<int64_t, 3>> calls;  // step, rank, generation
};

// `edl ctl stop` (edl/proto/PROTOCOL.md): a generation with no members and reason "stop". Every
// trainer leaves at the same step, and rank 0 of the generation before saves that step first;
// a plain shrink to nobody (another reason) saves nothing.
TEST(ElasticTrainerTest, StopGenerationMakesRankZeroSaveTheAgreedStepBeforeEveryoneLeaves) {
  for (const std::string reason : {"stop", "script"}) {
    test::ScratchDir dir("stop");
    FakeCluster c;
    FinishRecorder loader;
    const int64_t start = c.Commit({"a", "b"}, false, "start");
    TrainerThread t[2];
    StartWithLoader(&c, dir, &loader, 20, kUntilStopped, t);
    ASSERT_TRUE(c.WaitFor([&] { return c.max_step_ >= 3; }));  // formed and training
    c.Commit({}, false, reason);
    for (auto& tt : t) tt.thread.join();
    for (auto& tt : t) {
      EXPECT_OK(tt.status);
      EXPECT_TRUE(tt.result.left) << reason;
      EXPECT_EQ(tt.result.step, t[0].result.step) << "one agreed step";
    }
    if (reason == "stop") {
      ASSERT_EQ(loader.calls.size(), 1u) << "rank 0 alone saves";
      EXPECT_EQ(loader.calls[0][0], t[0].result.step);
      EXPECT_EQ(loader.calls[0][1], 0);
      EXPECT_EQ(loader.calls[0][2], start) << "saved under the generation it trained in";
    } else {
      EXPECT_TRUE(loader.calls.empty()) << "leaving is not finishing";
    }
  }
}

// A store already holding a checkpoint of a newer generation refuses every save of this job (the
// fence): each refusal reaches the events as a trainer event of rank 0, with the fence's reason,
// and the stop's final save is reported refused too (checkpoint_failed, then stop_checkpoint ok
// false), instead of only a line in rank 0's log.
TEST(ElasticTrainerTest, RefusedCheckpointSavesAreTrainerEvents) {
  test::ScratchDir dir("refused");
  FakeCluster c;
  auto store = ckpt::NewMemoryStore();
  // The earlier run's checkpoint, which this job resumes from: same model, generation 40.
  LinearModel earlier(kTrain, kTest, 30);
  TrainingState at;
  at.step = 1;
  ckpt::CheckpointMeta newer;
  EncodeCheckpointMeta(at, &newer);
  newer.generation = 40;
  newer.wall_time_micros = 1;  // saved long before this job's writer started
  newer.fingerprint = earlier.Fingerprint() + ";";
  std::vector<ckpt::TensorView> views;
  for (const StateTensor& t : earlier.StateTensors()) {
    views.push_back({t.name, t.dtype, t.shape, t.data, t.bytes});
  }
  ASSERT_OK(store->Save(newer, views, nullptr));
  CheckpointLoaderOptions lo;
  lo.save.checkpoint_steps = 2;
  CheckpointLoader loader(std::move(store), lo);
  const int64_t start = c.Commit({"a", "b"}, false, "start");
  TrainerThread t[2];
  // Until stopped: the first asynchronous save may finish only after 8 epochs' worth of these
  // tiny steps, and a job that ended would report its refusals merged into one event.
  StartWithLoader(&c, dir, &loader, 30, kUntilStopped, t);
  auto refusals = [&] {
    int n = 0;
    for (const auto& e : c.events_) n += e["event"] == "checkpoint_failed" ? 1 : 0;
    return n;
  };
  ASSERT_TRUE(c.WaitFor([&] { return refusals() >= 2; })) << "no refused save became an event";
  c.Commit({}, false, "stop");
  for (auto& tt : t) tt.thread.join();
  std::lock_guard<std::mutex> l(c.mu_);
  bool stop_reported = false;
  for (const auto& e : c.events_) {
    if (e["event"] == "stop_checkpoint") {
      EXPECT_EQ(e["ok"], false) << e.dump();
      stop_reported = true;
    }
    if (e["event"] != "checkpoint_failed") continue;
    EXPECT_EQ(e["trainer"], "a") << "rank 0 alone saves: " << e.dump();
    EXPECT_EQ(e["generation"], start) << e.dump();
    EXPECT_EQ(e["refused"], true) << e.dump();
    EXPECT_EQ(e["code"], "FailedPrecondition") << e.dump();
    EXPECT_GE(e["failed"].get<int64_t>(), 1) << e.dump();
    EXPECT_GT(e["step"].get<int64_t>(), 0) << e.dump();
    const std::string error = e["error"];
    EXPECT_NE(error.find("generation 40"), std::string::npos) << error;
    EXPECT_NE(error.find("before this writer started"), std::string::npos) << error;
  }
  EXPECT_TRUE(stop_reported);
}

// Two ranks over Gloo in static mode (rendezvous and logs under `dir`), one epoch; returns each
// rank's result.
template <typename Model>
void RunPair(const test::ScratchDir& dir, bool stage, std::unique_ptr<Model> models[2],
             ElasticResult res[2]) {
  std::vector<std::unique_ptr<MembershipSource>> m;
  for (int r = 0; r < 2; ++r) {
    m.push_back(NewStaticMembership(r, 2, 1, std::make_unique<FileKvStore>(dir.Join("rdzv"))));
    models[r] = std::make_unique<Model>(kTrain, kTest, r + 3);
  }
  EXPECT_EQ(m[1]->trainer_id(), "rank-1");
  Status st[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ElasticOptions o = Options(dir, "r" + std::to_string(r), false);
      o.epochs = 1;
      o.stage_through_host = stage;
      ElasticTrainer trainer(o, models[r].get(), m[r].get());
      st[r] = trainer.Run(&res[r]);
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_OK(st[0]);
  ASSERT_OK(st[1]);
}

TEST(ElasticTrainerTest, StaticModeTrainsAFixedWorldOverAFileStore) {
  test::ScratchDir dir("static");
  std::unique_ptr<LinearModel> models[2];
  ElasticResult res[2];
  RunPair(dir, /*stage=*/false, models, res);
  if (HasFatalFailure()) return;
  EXPECT_EQ(res[0].state_hash, res[1].state_hash);
  EXPECT_EQ(res[0].step, kTrain / 16);
  ExpectExactlyOnce(dir, {"r0", "r1"}, 1);
  // A fixed world: every step but the first was announced, with its epoch, by a Prefetch.
  for (auto& m : models) EXPECT_EQ(m->prefetch_hits_, res[0].step - 1);
}

// Records what the runtime tells the Trainable about each step: BeginStep's plan, and the
// stand-in of a step that gives this rank no samples.
class PlanRecordingModel : public LinearModel {
 public:
  using LinearModel::LinearModel;
  void BeginStep(const StepPlan& plan) override { plans.push_back(plan); }
  Status ForwardBackward(const std::vector<int64_t>& idx, StepStats* st) override {
    trained.push_back(idx);
    return LinearModel::ForwardBackward(idx, st);
  }
  Status EmptyStep(const std::vector<int64_t>& stand_in) override {
    stand_ins.push_back({plans.size(), stand_in});
    return LinearModel::EmptyStep(stand_in);  // zeroes the gradients
  }
  std::vector<StepPlan> plans;
  std::vector<std::vector<int64_t>> trained;
  std::vector<std::pair<size_t, std::vector<int64_t>>> stand_ins;  // (steps begun, indices)
};

// 17 samples, 8 per rank and step, 2 ranks: each epoch is a step of 16 and one of a single
// sample, which leaves rank 1 none. BeginStep tells each rank the step's position, batches and
// rank (enough to derive its slices with a DataPlan of its own); rank 1's empty step gets rank 0's
// sample as its stand-in, and contributes nothing: both ranks end identical.
TEST(ElasticTrainerTest, TheTrainableLearnsEachStepsPlanAndAnEmptySliceGetsAStandIn) {
  test::ScratchDir dir("step-plan");
  constexpr int64_t kSamples = 17;
  std::unique_ptr<PlanRecordingModel> models[2];
  std::vector<std::unique_ptr<MembershipSource>> m;
  for (int r = 0; r < 2; ++r) {
    m.push_back(NewStaticMembership(r, 2, 1, std::make_unique<FileKvStore>(dir.Join("rdzv"))));
    models[r] = std::make_unique<PlanRecordingModel>(kSamples, kTest, 5);
  }
  Status st[2];
  ElasticResult res[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ElasticOptions o = Options(dir, "r" + std::to_string(r), false);
      o.epochs = 2;
      o.evaluate_each_epoch = false;
      ElasticTrainer trainer(o, models[r].get(), m[r].get());
      st[r] = trainer.Run(&res[r]);
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_OK(st[0]);
  ASSERT_OK(st[1]);
  EXPECT_EQ(res[0].state_hash, res[1].state_hash);
  ASSERT_EQ(res[0].step, 4);
  DataPlan plan(kSamples, Options(dir, "x", false).seed);
  for (int r = 0; r < 2; ++r) {
    const auto& plans = models[r]->plans;
    ASSERT_EQ(plans.size(), 4u);
    DataPosition pos;
    for (int64_t s = 0; s < 4; ++s) {
      const Trainable::StepPlan& p = plans[s];
      EXPECT_EQ(p.step, s);
      EXPECT_EQ(p.position, pos) << "rank " << r << " step " << s;
      EXPECT_EQ(p.batch_sizes, (std::vector<int64_t>{8, 8}));
      EXPECT_EQ(p.rank, r);
      EXPECT_EQ(p.world_size, 2);
      EXPECT_GT(p.generation, 0);
      pos = plan.Advance(pos, p.batch_sizes);
    }
  }
  // Rank 0 trains every step; rank 1 every other one, and stands in with rank 0's single sample.
  EXPECT_EQ(models[0]->trained.size(), 4u);
  EXPECT_TRUE(models[0]->stand_ins.empty());
  ASSERT_EQ(models[1]->trained.size(), 2u);
  ASSERT_EQ(models[1]->stand_ins.size(), 2u);
  for (const auto& [begun, stand_in] : models[1]->stand_ins) {
    ASSERT_EQ(stand_in.size(), 1u);
    EXPECT_EQ(stand_in, models[0]->trained[begun - 1]) << "step " << begun;
  }
}

// The runtime reaches the gradient buffer only through CopyToHost / CopyFromHost (it is device
// memory on CUDA): in-band words and the zeroing of an empty slice go through views of it.
class CopyCountingModel : public LinearModel {
 public:
  using LinearModel::LinearModel;
  Status CopyToHost(const StateTensor& t, void* dst) override {
    to_host.push_back(t.name);
    return LinearModel::CopyToHost(t, dst);
  }
  Status CopyFromHost(const StateTensor& t, const void* src) override {
    from_host.push_back(t.name);
    return LinearModel::CopyFromHost(t, src);
  }
  std::vector<std::string> to_host, from_host;
};

TEST(TrainableTest, InbandWordsAndZeroingGoThroughHostCopies) {
  CopyCountingModel m(kTrain, kTest, 1);
  size_t count = 0;
  float* g = m.GradientBuffer(&count);
  for (size_t i = 0; i < count + Trainable::kInbandSlots; ++i) g[i] = 7.f;
  const float words[Trainable::kInbandSlots] = {1.f, 2.f, 3.f, 4.f};
  ASSERT_OK(m.WriteInband(words));
  EXPECT_EQ(g[count - 1], 7.f);  // gradients untouched
  EXPECT_EQ(g[count], 1.f);
  EXPECT_EQ(g[count + 3], 4.f);
  float back[Trainable::kInbandSlots] = {};
  ASSERT_OK(m.ReadInband(back));
  EXPECT_EQ(back[2], 3.f);
  ASSERT_OK(m.ZeroGradients());
  for (size_t i = 0; i < count + Trainable::kInbandSlots; ++i) EXPECT_EQ(g[i], 0.f) << i;
  EXPECT_EQ(m.from_host, (std::vector<std::string>{"gradients/inband", "gradients"}));
  EXPECT_EQ(m.to_host, std::vector<std::string>{"gradients/inband"});
}

// "Device" memory on CPU: every pointer the runtime gets (state tensors, the gradient buffer) is
// tagged into a non-canonical address, so handing one to Gloo (or any dereference) faults; only
// CopyToHost / CopyFromHost untag it, as a CUDA trainer's copies would. With on_device() and Gloo
// the runtime must stage the all-reduce and the state broadcast through host memory.
class DeviceLikeModel : public LinearModel {
 public:
  using LinearModel::LinearModel;
  bool on_device() const override { return true; }
  std::vector<StateTensor> StateTensors() override {
    std::vector<StateTensor> v = LinearModel::StateTensors();
    for (StateTensor& t : v) t.data = Tag(t.data);
    return v;
  }
  float* GradientBuffer(size_t* count) override {
    return static_cast<float*>(Tag(LinearModel::GradientBuffer(count)));
  }
  Status CopyToHost(const StateTensor& t, void* dst) override {
    StateTensor host = t;
    host.data = Tag(t.data);
    return LinearModel::CopyToHost(host, dst);
  }
  Status CopyFromHost(const StateTensor& t, const void* src) override {
    StateTensor host = t;
    host.data = Tag(t.data);
    return LinearModel::CopyFromHost(host, src);
  }
  void* AllocateHostStaging(size_t bytes) override {
    ++staging_allocations;
    return LinearModel::AllocateHostStaging(bytes);
  }
  int staging_allocations = 0;

 private:
  static void* Tag(void* p) {  // an involution: tags host pointers, untags tagged ones
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) ^ (uintptr_t{1} << 62));
  }
};

int64_t Count(const std::vector<std::string>& names, const std::string& name) {
  return std::count(names.begin(), names.end(), name);
}

TEST(ElasticTrainerTest, GlooWithDeviceTensorsStagesThroughHostWithIdenticalResults) {
  std::unique_ptr<CopyCountingModel> direct[2], forced[2];
  std::unique_ptr<DeviceLikeModel> device[2];
  ElasticResult rd[2], rf[2], rv[2];
  test::ScratchDir d1("direct"), d2("forced"), d3("device");
  RunPair(d1, /*stage=*/false, direct, rd);
  RunPair(d2, /*stage=*/true, forced, rf);
  RunPair(d3, /*stage=*/false, device, rv);  // staged because on_device() with Gloo
  if (HasFatalFailure()) return;
  const int64_t steps = kTrain / 16;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rd[r].step, steps);
    // Staging changes where the bytes are reduced, not the bytes: bit-identical state and loss.
    EXPECT_EQ(rf[r].state_hash, rd[0].state_hash) << r;
    EXPECT_EQ(rv[r].state_hash, rd[0].state_hash) << r;
    EXPECT_EQ(rd[r].state_hash, rd[0].state_hash) << r;
    EXPECT_EQ(rf[r].last_loss, rd[r].last_loss);
    EXPECT_EQ(rv[r].last_loss, rd[r].last_loss);
    EXPECT_EQ(rf[r].step, steps);
    EXPECT_EQ(rv[r].step, steps);
    // The direct path reduces the buffer in place; the staged one copies it out and back each step.
    EXPECT_EQ(Count(direct[r]->to_host, "gradients"), 0) << r;
    EXPECT_EQ(Count(forced[r]->to_host, "gradients"), steps) << r;
    EXPECT_EQ(Count(forced[r]->from_host, "gradients"), steps) << r;
    // One staging buffer, grown for the larger of the gradients and the packed state, then kept.
    EXPECT_GE(device[r]->staging_allocations, 1) << r;
    EXPECT_LE(device[r]->staging_allocations, 2) << r;
  }
}

// A clock that moves one second each time a thread reads it, counted per thread: a trainer's
// progress window between two reports then lasts exactly one of its reads.
class PerThreadTickClock : public Clock {
 public:
  int64_t NowMicros() const override {
    thread_local int64_t now = 0;
    return now += 1'000'000;
  }
  int64_t WallMicros() const override { return NowMicros(); }
};

TEST(ElasticTrainerTest, ProgressReportsThisRanksOwnRateSoTheControlPlaneCanSumThem) {
  test::ScratchDir dir("rate");
  FakeCluster c;
  PerThreadTickClock clock;
  c.Commit({"a", "b"}, false, "start");
  TrainerThread t[2];
  for (int i = 0; i < 2; ++i) {
    t[i].id = std::string(1, static_cast<char>('a' + i));
    t[i].model = std::make_unique<LinearModel>(kTrain, kTest, 20 + i);
    t[i].membership = std::make_unique<FakeMembership>(&c, t[i].id);
  }
  for (auto& tt : t) {
    tt.thread = std::thread([&] {
      ElasticOptions o = Options(dir, tt.id, false);
      o.max_steps = 10;
      o.evaluate_each_epoch = false;
      o.clock = &clock;
      ElasticTrainer trainer(o, tt.model.get(), tt.membership.get());
      tt.status = trainer.Run(&tt.result);
    });
  }
  for (auto& tt : t) tt.thread.join();
  for (auto& tt : t) {
    ASSERT_OK(tt.status);
    const std::vector<double>& ips = c.images_per_sec_[tt.id];
    ASSERT_FALSE(ips.empty()) << tt.id;
    // Batch 8 per rank (16 a step in all). A step reads this clock 5 times, a tick each: around
    // the forward/backward, around the all-reduce (the step times the job measures of itself),
    // and the report's window. So this rank's rate is 8 / 5 a tick, the whole job's 16 / 5.
    constexpr double kTicksPerStep = 5;
    for (double v : ips) EXPECT_LE(v, 8.0 / kTicksPerStep) << tt.id << ": the whole job's rate";
    EXPECT_DOUBLE_EQ(*std::max_element(ips.begin(), ips.end()), 8.0 / kTicksPerStep) << tt.id;
  }
}

// What the job measures of itself (self_measure.h) travels in the progress reports: at world 2
// the gradient noise estimate, the same on both ranks (its inputs are all-reduced), and each
// rank's compute time per sample and all-reduce time per step (one tick of this clock each: 1 s
// over 8 samples, 1 s); at world 1 no noise estimate and no all-reduce time.
TEST(ElasticTrainerTest, ProgressCarriesTheNoiseScaleAndTheStepTimes) {
  for (const int world : {2, 1}) {
    SCOPED_TRACE("world " + std::to_string(world));
    test::ScratchDir dir("measure");
    FakeCluster c;
    PerThreadTickClock clock;
    std::vector<std::string> ids = {"a", "b"};
    ids.resize(world);
    c.Commit(ids, false, "start");
    TrainerThread t[2];
    for (int i = 0; i < world; ++i) {
      t[i].id = ids[i];
      t[i].model = std::make_unique<LinearModel>(kTrain, kTest, 30 + i);
      t[i].membership = std::make_unique<FakeMembership>(&c, t[i].id);
    }
    for (int i = 0; i < world; ++i) {
      TrainerThread& tt = t[i];
      tt.thread = std::thread([&] {
        ElasticOptions o = Options(dir, tt.id, false);
        o.max_steps = 20;
        o.evaluate_each_epoch = false;
        o.clock = &clock;
        ElasticTrainer trainer(o, tt.model.get(), tt.membership.get());
        tt.status = trainer.Run(&tt.result);
      });
    }
    for (int i = 0; i < world; ++i) t[i].thread.join();
    for (int i = 0; i < world; ++i) {
      ASSERT_OK(t[i].status);
      const std::vector<ProgressInfo>& r = c.reports_[ids[i]];
      ASSERT_EQ(r.size(), 20u) << ids[i];
      const ProgressInfo& last = r.back();
      EXPECT_DOUBLE_EQ(last.compute_s_per_sample, 1.0 / 8) << ids[i];
      // The job's batch rule goes with every report (the server's goodput model predicts by it).
      const ElasticOptions o = Options(dir, ids[i], false);
      EXPECT_EQ(last.batch, o.batch) << ids[i];
      EXPECT_EQ(last.batch_policy, o.batch_policy) << ids[i];
      if (world == 1) {
        EXPECT_EQ(last.noise_steps, 0) << ids[i];
        EXPECT_EQ(last.noise_scale, -1) << ids[i];
        EXPECT_EQ(last.sync_s, -1) << ids[i];
        continue;
      }
      EXPECT_DOUBLE_EQ(last.sync_s, 1.0) << ids[i];
      // Every step of the two ranks feeds the estimate: 20 steps behind the last report.
      EXPECT_EQ(last.noise_steps, 20) << ids[i];
      EXPECT_TRUE(std::isfinite(last.grad_sqr) && std::isfinite(last.grad_var)) << ids[i];
      EXPECT_GT(last.grad_var, 0) << ids[i] << ": the samples' gradients differ";
      // The linear model starts far from its fit: the true gradient dominates.
      EXPECT_GT(last.grad_sqr, 0) << ids[i];
      EXPECT_GT(last.noise_scale, 0) << ids[i];
      EXPECT_DOUBLE_EQ(last.noise_scale, last.grad_var / last.grad_sqr) << ids[i];
    }
    if (world == 2) {
      const ProgressInfo &a = c.reports_["a"].back(), &b = c.reports_["b"].back();
      EXPECT_EQ(a.step, b.step);
      EXPECT_DOUBLE_EQ(a.grad_sqr, b.grad_sqr);
      EXPECT_DOUBLE_EQ(a.grad_var, b.grad_var);
    }
  }
}

// A re-form whose switch step is the last step of an epoch still evaluates that epoch (after the
// re-form, on the new generation), like every other epoch end: 3 trainers (16 steps an epoch)
// shrink to 2 (24 steps an epoch) at step 16.
TEST(ElasticTrainerTest, EpochEndingInTheSwitchStepIsEvaluatedAfterTheReform) {
  test::ScratchDir dir("eval_switch");
  FakeCluster c;
  TrainerThread t[3];
  c.Commit({"e0", "e1", "e2"}, false, "start");
  c.HoldAt(15);
  for (int i = 0; i < 3; ++i) {
    t[i].id = "e" + std::to_string(i);
    t[i].model = std::make_unique<LinearModel>(kTrain, kTest, 30 + i);
    t[i].membership = std::make_unique<FakeMembership>(&c, t[i].id);
  }
  for (auto& tt : t) {
    tt.thread = std::thread([&] {
      ElasticOptions o = Options(dir, tt.id, false);
      o.epochs = 3;
      ElasticTrainer trainer(o, tt.model.get(), tt.membership.get());
      tt.status = trainer.Run(&tt.result);
    });
  }
  // Held after step 15: once both survivors built generation 2's communicator ahead (their
  // watchers saw it), every member votes for the switch in step 16, the epoch's last.
  ASSERT_TRUE(c.WaitFor([&] { return c.max_step_ >= 15; }));
  const int64_t gen = c.Commit({"e0", "e1"}, false, "script");
  ASSERT_TRUE(c.WaitFor([&] { return c.BuiltAhead(gen, {"e0", "e1"}); }));
  c.HoldAt(INT64_MAX);
  for (auto& tt : t) tt.thread.join();
  for (auto& tt : t) ASSERT_OK(tt.status);
  ASSERT_TRUE(t[2].result.left);

  std::map<int64_t, std::set<std::string>> evaluated;  // step -> trainers that evaluated it
  int64_t switch_step = -1;
  for (const auto& e : c.events_) {
    if (e["event"] == "eval")
      evaluated[e["step"].get<int64_t>()].insert(e["trainer"].get<std::string>());
    if (e["event"] == "leave") switch_step = e["step"].get<int64_t>();
  }
  ASSERT_EQ(switch_step, 16) << "the shrink must land on the epoch's last step";
  const std::set<std::string> survivors = {"e0", "e1"};
  EXPECT_EQ(evaluated[16], survivors)
      << "the epoch that ended in the switch step was not evaluated";
  EXPECT_EQ(evaluated[40], survivors);
  EXPECT_EQ(evaluated[64], survivors);
  EXPECT_EQ(evaluated.size(), 3u);
}

// A failure that cuts an epoch-end evaluation short: the survivor stops evaluating its shard as
// soon as the failure generation is committed (the evaluation's all-reduce cannot finish anyway)
// instead of computing the rest of it first, re-forms, and evaluates only what it does not hold
// of that epoch's evaluation.
class GatedEvalModel : public LinearModel {
 public:
  using LinearModel::LinearModel;
  Status Evaluate(const std::vector<int64_t>& idx, StepStats* st) override {
    if (++evals == 1 && first_eval) first_eval();
    if (fail_evals) return Status::Internal("injected crash in the evaluation");
    return LinearModel::Evaluate(idx, st);
  }
  std::atomic<int> evals{0};
  std::function<void()> first_eval;  // runs in the first Evaluate call, on the trainer's thread
  bool fail_evals = false;
};

// Runs trainer `id` of the default options to its end into *s, evaluating in chunks of 8 test
// samples (8 chunks in a shard of 64 test samples: 2 ranks; 16 in one of 128), then wakes `c`.
void RunInEightSampleChunks(FakeCluster* c, const test::ScratchDir& dir, const std::string& id,
                            LinearModel* m, FakeMembership* f, Status* s) {
  ElasticOptions o = Options(dir, id, false);
  o.eval_batch = 8;
  ElasticTrainer trainer(o, m, f);
  ElasticResult r;
  *s = trainer.Run(&r);
  c->Notify();
}

TEST(ElasticTrainerTest, AFailureCutsAnEvaluationShortAtOnce) {
  test::ScratchDir dir("eval_cut");
  FakeCluster c;
  c.Commit({"v0", "v1"}, false, "start");
  auto m0 = std::make_unique<GatedEvalModel>(kTrain, kTest, 1);
  auto m1 = std::make_unique<GatedEvalModel>(kTrain, kTest, 2);
  m1->fail_evals = true;  // v1 dies in the first evaluation (its Trainable fails: it leaves)
  std::atomic<bool> committed{false};
  // v0 computes its first chunk only once the failure generation is committed.
  m0->first_eval = [&] { c.WaitFor([&] { return committed.load(); }); };
  FakeMembership f0(&c, "v0"), f1(&c, "v1");
  Status s0, s1;
  std::thread t0(RunInEightSampleChunks, &c, std::cref(dir), "v0", m0.get(), &f0, &s0);
  std::thread t1(RunInEightSampleChunks, &c, std::cref(dir), "v1", m1.get(), &f1, &s1);
  t1.join();
  EXPECT_EQ(s1.code(), Status::Code::kInternal) << s1.ToString();
  c.Commit({"v0"}, true, "failure");
  committed = true;
  c.Notify();
  t0.join();
  ASSERT_OK(s0);
  // 1 chunk of the cut evaluation, kept; then the rest of that epoch's at world 1 (15 chunks:
  // the 8 samples v0 holds are not evaluated again), then every other epoch's, 16 chunks each.
  // Computing the rest of the cut shard first would have made it 7 more; evaluating the cut
  // epoch again from scratch, 1 more.
  EXPECT_EQ(m0->evals.load(), 1 + 15 + 7 * 16);
  // Its stall counts the evaluation work it kept (the chunk before, the rest after) as eval_s,
  // not as time lost or as its first step.
  int stalls = 0;
  for (const auto& e : c.events_) {
    if (e["event"] != "stall" || e["trainer"] != "v0") continue;
    ++stalls;
    EXPECT_EQ(test::CheckStallBreakdown(e), "");
    EXPECT_GT(e["eval_s"].get<double>(), 0) << e.dump();
  }
  EXPECT_EQ(stalls, 1);

  // The cut evaluation's result is the whole test set's: the same as that of a run without the
  // failure, whose first epoch trained alike (the failure came after its last step).
  test::ScratchDir ref_dir("eval_ref");
  FakeCluster ref;
  ref.Commit({"w0", "w1"}, false, "start");
  GatedEvalModel r0(kTrain, kTest, 1), r1(kTrain, kTest, 2);
  FakeMembership g0(&ref, "w0"), g1(&ref, "w1");
  Status q0, q1;
  auto run_ref = [&](const std::string& id, GatedEvalModel* m, FakeMembership* f, Status* s) {
    ElasticOptions o = Options(ref_dir, id, false);
    o.eval_batch = 8;
    o.epochs = 1;
    ElasticTrainer trainer(o, m, f);
    ElasticResult r;
    *s = trainer.Run(&r);
  };
  std::thread u0(run_ref, "w0", &r0, &g0, &q0);
  std::thread u1(run_ref, "w1", &r1, &g1, &q1);
  u0.join();
  u1.join();
  ASSERT_OK(q0);
  ASSERT_OK(q1);
  auto first_eval = [](FakeCluster* fc, const std::string& trainer) {
    nlohmann::json first;
    for (const auto& e : fc->events_) {
      if (e["event"] == "eval" && e["trainer"] == trainer &&
          (first.is_null() || e["step"] < first["step"]))
        first = e;
    }
    return first;
  };
  const nlohmann::json cut = first_eval(&c, "v0"), whole = first_eval(&ref, "w0");
  ASSERT_FALSE(cut.is_null());
  ASSERT_FALSE(whole.is_null());
  EXPECT_EQ(cut["step"], whole["step"]);
  EXPECT_EQ(cut["accuracy"], whole["accuracy"]) << cut.dump() << " vs " << whole.dump();
  EXPECT_NEAR(cut["loss"].get<double>(), whole["loss"].get<double>(),
              1e-9 * std::abs(whole["loss"].get<double>()))
      << cut.dump() << " vs " << whole.dump();
}

// A failure in the first step after an epoch end's evaluation: the survivor and the replacement
// that joins in the failure's own generation (a warm spare's way) re-form on that epoch end (the
// step in flight is lost), and the evaluation completed there is not done again; the replacement
// reports its accuracy from then on.
class FailsInSecondEpochModel : public LinearModel {
 public:
  using LinearModel::LinearModel;
  void SetEpoch(int64_t epoch) override {
    LinearModel::SetEpoch(epoch);
    if (epoch >= 1) fail_next_ = true;  // its next step fails: after the first epoch's evaluation
  }
};

TEST(ElasticTrainerTest, AFailureRightAfterAnEvaluationDoesNotRepeatIt) {
  test::ScratchDir dir("eval_done");
  FakeCluster c;
  c.Commit({"d0", "d1"}, false, "start");
  auto m0 = std::make_unique<GatedEvalModel>(kTrain, kTest, 1);
  auto m1 = std::make_unique<FailsInSecondEpochModel>(kTrain, kTest, 2);
  FakeMembership f0(&c, "d0"), f1(&c, "d1");
  Status s0, s1;
  std::thread t0(RunInEightSampleChunks, &c, std::cref(dir), "d0", m0.get(), &f0, &s0);
  std::thread t1(RunInEightSampleChunks, &c, std::cref(dir), "d1", m1.get(), &f1, &s1);
  t1.join();
  EXPECT_EQ(s1.code(), Status::Code::kInternal) << s1.ToString();
  TrainerThread d2;
  d2.id = "d2";
  Start(&c, dir, &d2, 3, /*joining=*/true, &c);
  ASSERT_TRUE(c.WaitFor([&] { return c.ready_.count("d2") > 0; }));  // prepared, as a warm spare is
  c.Commit({"d0", "d2"}, true, "failure");
  c.Notify();
  t0.join();
  d2.thread.join();
  ASSERT_OK(s0);
  ASSERT_OK(d2.status);
  // 8 epochs' evaluations at world 2, 8 chunks each; evaluating the first epoch's end again after
  // the re-form would have made it 8 more.
  EXPECT_EQ(m0->evals.load(), 8 * 8);
  const int64_t epoch_end = kTrain / 16;                // 16 samples a step at world 2
  std::map<std::string, std::map<int64_t, int>> evals;  // trainer -> step -> its "eval" events
  std::map<std::string, int64_t> synced;                // trainer -> step synced in generation 2
  double accuracy = -2;                                 // the first epoch's, as d0 evaluated it
  for (const auto& e : c.events_) {
    const std::string who = e.value("trainer", "");
    if (e["event"] == "eval") {
      evals[who][e["step"].get<int64_t>()]++;
      if (who == "d0" && e["step"] == epoch_end) accuracy = e["accuracy"].get<double>();
    }
    if (e["event"] == "sync" && e["generation"] == 2) synced[who] = e["step"].get<int64_t>();
  }
  EXPECT_EQ(synced["d0"], epoch_end) << "the failure did not re-form on the first epoch's end";
  EXPECT_EQ(synced["d2"], epoch_end);
  EXPECT_EQ(evals["d0"][epoch_end], 1);
  EXPECT_EQ(evals["d2"].count(epoch_end), 0u);
  EXPECT_EQ(evals["d0"].size(), 8u);
  EXPECT_EQ(evals["d2"].size(), 7u);
  // The replacement's first progress report carries the accuracy of the evaluation it joined after.
  ASSERT_FALSE(c.accuracies_["d2"].empty());
  EXPECT_GE(accuracy, 0);
  EXPECT_EQ(c.accuracies_["d2"].front(), accuracy);
  ExpectExactlyOnce(dir, {"d0", "d1", "d2"}, 8);
}

// The rendezvous outlives a server restart: while the KV answers Unavailable (the node's client is
// between server connections), a re-form retries within its bound instead of failing and then
// waiting for a generation that nobody makes (generation_wait, 30 s here, then the trainer fails).
// The job's first rendezvous meets a 40-call outage and still trains to the end in generation 1.
// Trainers `a` and `b` started in a first generation of the two (committed here).
void StartPair(FakeCluster* c, const test::ScratchDir& dir, TrainerThread (&t)[2], const char* a,
               const char* b) {
  t[0].id = a;
  t[1].id = b;
  c->Commit({a, b}, false, "start");
  for (int i = 0; i < 2; ++i) Start(c, dir, &t[i], i + 1, false, c);
}

TEST(ElasticTrainerTest, RendezvousRetriesThroughAKvOutage) {
  test::ScratchDir dir("kv_outage");
  FakeCluster c;
  TrainerThread t[2];
  c.kv.Refuse(40);
  StartPair(&c, dir, t, "u0", "u1");
  for (auto& tt : t) tt.thread.join();
  ASSERT_OK(t[0].status);
  ASSERT_OK(t[1].status);
  EXPECT_EQ(c.kv.refused(), 40) << "the outage never happened";
  EXPECT_EQ(t[0].result.state_hash, t[1].result.state_hash);
  ExpectExactlyOnce(dir, {"u0", "u1"}, 8);
}

// A rendezvous that fails with nothing newer committed is reported (reform_failed, naming the
// generation and the error); the server answers with a new generation (here the test plays it:
// the same members again), and the job goes on. Without the report the trainers would wait out
// generation_wait (30 s) and fail.
TEST(ElasticTrainerTest, ReformFailureIsReportedAndTheNextGenerationRecovers) {
  test::ScratchDir dir("reform_failed");
  FakeCluster c;
  TrainerThread t[2];
  c.kv.FailNextSet();
  StartPair(&c, dir, t, "r0", "r1");
  ASSERT_TRUE(c.WaitFor([&] {
    for (const auto& e : c.events_) {
      if (e["event"] == "reform_failed") return true;
    }
    return false;
  }));
  c.Commit({"r0", "r1"}, true, "reform_retry");
  for (auto& tt : t) tt.thread.join();
  ASSERT_OK(t[0].status);
  ASSERT_OK(t[1].status);
  EXPECT_EQ(t[0].result.state_hash, t[1].result.state_hash);
  bool named = false;
  for (const auto& e : c.events_) {
    if (e["event"] != "reform_failed") continue;
    EXPECT_EQ(e["generation"], 1) << e.dump();
    named |= e["error"].get<std::string>().find("injected") != std::string::npos;
  }
  EXPECT_TRUE(named) << "no reform_failed event named the injected error";
  ExpectExactlyOnce(dir, {"r0", "r1"}, 8, 1);
}

// A joiner whose grow is superseded by a failure generation before the survivors switch to it
// re-forms into the failure generation without ever having trained: it reports its first step
// (joiner_first_step), not a survivor's stall from a last step it never took.
TEST(ElasticTrainerTest, JoinerSupersededBeforeItsFirstStepReportsNoStall) {
  test::ScratchDir dir("superseded_joiner");
  FakeCluster c;
  TrainerThread t[3];
  const char* ids[] = {"s0", "s1", "j"};
  for (int i = 0; i < 3; ++i) {
    t[i].id = ids[i];
    t[i].model = std::make_unique<LinearModel>(kTrain, kTest, 40 + i);
    t[i].membership = std::make_unique<FakeMembership>(&c, t[i].id);
  }
  auto start = [&](TrainerThread* tt, bool joining) {
    tt->thread = std::thread([&, tt, joining] {
      ElasticOptions o = Options(dir, tt->id, joining);
      o.epochs = 2;
      o.evaluate_each_epoch = false;
      ElasticTrainer trainer(o, tt->model.get(), tt->membership.get());
      tt->status = trainer.Run(&tt->result);
    });
  };
  c.Commit({"s0", "s1"}, false, "start");
  c.HoldAt(5);
  start(&t[0], false);
  start(&t[1], false);
  ASSERT_TRUE(c.WaitFor([&] { return c.max_step_ >= 5; }));
  // The grow is committed while the survivors are held: they cannot switch to it.
  start(&t[2], true);
  ASSERT_TRUE(c.WaitFor([&] { return c.ready_.count("j") > 0; }));
  const int64_t keys = c.KvSets();
  c.Commit({"s0", "s1", "j"}, false, "grow");
  // Every rank published its rendezvous key for the grow (the survivors build ahead; the joiner
  // forms it and waits in the state sync for survivors that do not come). Then s1 "fails" before
  // the switch: a failure generation without it supersedes the grow.
  ASSERT_TRUE(c.WaitFor([&] { return c.kv_sets_ >= keys + 3; }));
  c.Commit({"s0", "j"}, true, "failure");
  c.HoldAt(INT64_MAX);
  for (auto& tt : t) tt.thread.join();
  ASSERT_OK(t[0].status);
  ASSERT_OK(t[2].status);
  EXPECT_EQ(t[0].result.state_hash, t[2].result.state_hash);
  int first_steps = 0;
  for (const auto& e : c.events_) {
    if (e["trainer"] != "j") continue;
    EXPECT_NE(e["event"], "stall") << "a trainer that never stepped has no stall: " << e.dump();
    first_steps += e["event"] == "joiner_first_step";
  }
  EXPECT_EQ(first_steps, 1);
}

// The real clock moved forward by what the test skips: a wait the runtime times, passed at once.
class SkippingClock : public Clock {
 public:
  int64_t NowMicros() const override { return Clock::Real()->NowMicros() + skipped_.load(); }
  int64_t WallMicros() const override { return Clock::Real()->WallMicros() + skipped_.load(); }
  void Skip(milliseconds d) { skipped_ += d.count() * 1000; }

 private:
  std::atomic<int64_t> skipped_{0};
};

// Make-before-break's fallback (elastic_trainer_switch.cc, kMaxPrepareWait: 2 s): when the builds
// ahead are held up (here every rendezvous write of the new generation waits at a gate), members
// vote against the switch and train on in the old generation; once one has waited 2 s since it
// saw the generation it votes for the switch anyway, and the members switch and finish the build
// in the re-form. The 2 s pass on a clock the test skips forward, so the switch step is exact.
TEST(ElasticTrainerTest, HeldUpBuildsAheadSwitchAnywayAfterTheMaxPrepareWait) {
  test::ScratchDir dir("held_up_build");
  FakeCluster c;
  SkippingClock clock;
  TrainerThread t[3];
  c.Commit({"h0", "h1", "h2"}, false, "start");
  c.HoldAt(5);
  for (int i = 0; i < 3; ++i) {
    t[i].id = "h" + std::to_string(i);
    t[i].model = std::make_unique<LinearModel>(kTrain, kTest, 50 + i);
    t[i].membership = std::make_unique<FakeMembership>(&c, t[i].id);
  }
  for (auto& tt : t) {
    tt.thread = std::thread([&] {
      ElasticOptions o = Options(dir, tt.id, false);
      o.epochs = 2;
      o.evaluate_each_epoch = false;
      o.clock = &clock;
      ElasticTrainer trainer(o, tt.model.get(), tt.membership.get());
      tt.status = trainer.Run(&tt.result);
    });
  }
  ASSERT_TRUE(c.WaitFor([&] { return c.max_step_ >= 5; }));
  c.CloseGate(proto::RendezvousPrefix(2, "gloo"));
  const int64_t gen = c.Commit({"h0", "h1"}, false, "script");
  // Both survivors saw the shrink and started building its communicator (held at the gate).
  ASSERT_TRUE(c.WaitFor([&] { return c.held_at_gate_ >= 2; }));
  // Steps 6..8 under the held builds: nobody switches (h2 would leave at the switch step).
  c.HoldAt(8);
  ASSERT_TRUE(c.WaitFor([&] { return c.max_step_ >= 8; }));
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    EXPECT_FALSE(c.Reported("h2", "leave"))
        << "switched before the builds ahead were done or waited for";
  }
  clock.Skip(milliseconds(2000));
  c.HoldAt(INT64_MAX);
  // The next step's votes carry the switch: h2 leaves there, while the builds are still held.
  ASSERT_TRUE(c.WaitFor([&] { return c.Reported("h2", "leave"); }));
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    EXPECT_FALSE(c.BuiltAhead(gen, {"h0"}) || c.BuiltAhead(gen, {"h1"}));
  }
  c.OpenGate();
  for (auto& tt : t) tt.thread.join();
  for (auto& tt : t) ASSERT_TRUE(tt.status.ok()) << tt.id << ": " << tt.status.ToString();
  EXPECT_TRUE(t[2].result.left);
  EXPECT_EQ(t[0].result.state_hash, t[1].result.state_hash);
  int stalls = 0;
  for (const auto& e : c.events_) {
    if (e["event"] == "leave") {
      EXPECT_EQ(e["step"], 9) << "the switch step: " << e.dump();
    }
    if (e["event"] != "stall" || e["generation"] != gen) continue;
    ++stalls;
    EXPECT_EQ(e["switch_step"], 9) << e.dump();
    EXPECT_EQ(e["prepared"], true)
        << "the held build is finished in the re-form, not redone: " << e.dump();
    EXPECT_EQ(test::CheckStallBreakdown(e), "");
  }
  EXPECT_EQ(stalls, 2);
  ExpectExactlyOnce(dir, {"h0", "h1", "h2"}, 2);
}

TEST(ElasticTrainerTest, JoinerThatIsNeverCommittedTimesOut) {
  FakeCluster c;
  c.Commit({"x"}, false, "start");
  LinearModel model(kTrain, kTest, 1);
  FakeMembership m(&c, "late");
  test::ScratchDir dir("late");
  ElasticOptions o = Options(dir, "late", true);
  o.generation_wait = milliseconds(200);
  ElasticTrainer trainer(o, &model, &m);
  ElasticResult r;
  Status s = trainer.Run(&r);
  EXPECT_TRUE(s.IsTimeout()) << s.ToString();
  EXPECT_EQ(c.ready_.count("late"), 1u);
}

}  // namespace
}  // namespace edl::runtime
