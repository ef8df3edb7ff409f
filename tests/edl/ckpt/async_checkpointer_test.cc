// AsyncCheckpointer: triggers by steps and seconds, one save in flight at a time, the final
// synchronous save, and errors kept as Status.
#include "edl/ckpt/async_checkpointer.h"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "tests/testutil.h"

namespace edl::ckpt {
namespace {

// Wraps a store; Save blocks until Release() so a test can hold a save "in flight".
class GatedStore : public CheckpointStore {
 public:
  explicit GatedStore(std::unique_ptr<CheckpointStore> inner) : inner_(std::move(inner)) {}
  Status Save(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
              int64_t* id) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++in_save_;
      max_in_save_ = std::max(max_in_save_, in_save_);
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(30), [this] { return open_; });
    }
    Status s = inner_->Save(meta, tensors, id);
    std::lock_guard<std::mutex> lock(mu_);
    --in_save_;
    return s;
  }
  Status List(std::vector<CheckpointMeta>* out) override { return inner_->List(out); }
  Status ReadTensors(const CheckpointMeta& meta, const std::function<void*(size_t)>& dst_for,
                     const std::function<Status(size_t)>& done) override {
    return inner_->ReadTensors(meta, dst_for, done);
  }
  std::string Describe() const override { return "gated " + inner_->Describe(); }

  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool WaitInSave() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [this] { return in_save_ > 0; });
  }
  int max_in_save() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_in_save_;
  }

 private:
  std::unique_ptr<CheckpointStore> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int in_save_ = 0;
  int max_in_save_ = 0;
};

struct Model {
  std::vector<float> w = std::vector<float>(1000, 1.f);
  std::vector<TensorView> Views() {
    return {{"w", DataType::kFloat32, {1000}, w.data(), w.size() * sizeof(float)}};
  }
};

CheckpointMeta Meta(int64_t step, int64_t generation = 1) {
  CheckpointMeta m;
  m.step = step;
  m.generation = generation;
  m.fingerprint = "m";
  return m;
}

TEST(AsyncCheckpointerTest, SavesEveryNStepsWithTheSnapshotOfThatStep) {
  auto store = NewMemoryStore(10);
  AsyncCheckpointerOptions o;
  o.checkpoint_steps = 3;
  AsyncCheckpointer ckpt(store.get(), o);
  Model model;
  std::vector<TensorView> views = model.Views();
  int started = 0;
  for (int step = 1; step <= 9; ++step) {
    model.w[0] = static_cast<float>(step);
    if (ckpt.MaybeSave(Meta(step), views, AsyncCheckpointer::HostCopy(views))) {
      ++started;
      model.w[0] = -1;  // training moves on: the snapshot must not see this
      ASSERT_OK(ckpt.WaitIdle(std::chrono::seconds(10)));
    }
  }
  EXPECT_EQ(started, 3);
  std::vector<CheckpointMeta> all;
  ASSERT_OK(store->List(&all));
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step, 3);
  EXPECT_EQ(all[2].step, 9);
  LoadedCheckpoint out;
  ASSERT_OK(store->LoadLatest("m", &out));
  EXPECT_EQ(reinterpret_cast<const float*>(out.Find("w"))[0], 9.f);
  EXPECT_EQ(ckpt.last_saved_step(), 9);
  EXPECT_EQ(ckpt.saves_completed(), 3);
}

TEST(AsyncCheckpointerTest, NeverTwoSavesInFlightAndSkippedSaveIsRetried) {
  GatedStore store(NewMemoryStore(10));
  AsyncCheckpointerOptions o;
  o.checkpoint_steps = 1;
  AsyncCheckpointer ckpt(&store, o);
  Model model;
  std::vector<TensorView> views = model.Views();
  auto copy = AsyncCheckpointer::HostCopy(views);
  ASSERT_TRUE(ckpt.MaybeSave(Meta(1), views, copy));
  ASSERT_TRUE(store.WaitInSave());
  EXPECT_TRUE(ckpt.busy());
  EXPECT_FALSE(ckpt.MaybeSave(Meta(2), views, copy));  // due but busy: skipped, training goes on
  EXPECT_FALSE(ckpt.MaybeSave(Meta(3), views, copy));
  EXPECT_EQ(ckpt.saves_skipped(), 2);
  store.Release();
  ASSERT_OK(ckpt.WaitIdle(std::chrono::seconds(10)));
  EXPECT_TRUE(ckpt.MaybeSave(Meta(4), views, copy));  // still due: taken at the next boundary
  ASSERT_OK(ckpt.WaitIdle(std::chrono::seconds(10)));
  EXPECT_EQ(store.max_in_save(), 1);
  EXPECT_EQ(ckpt.last_saved_step(), 4);
}

TEST(AsyncCheckpointerTest, TimeTriggerUsesTheClock) {
  auto store = NewMemoryStore();
  ManualClock clock;
  AsyncCheckpointerOptions o;
  o.checkpoint_secs = 60;
  o.clock = &clock;
  AsyncCheckpointer ckpt(store.get(), o);
  Model model;
  std::vector<TensorView> views = model.Views();
  EXPECT_FALSE(ckpt.MaybeSave(Meta(1), views, AsyncCheckpointer::HostCopy(views)));
  clock.Advance(61'000'000);
  EXPECT_TRUE(ckpt.MaybeSave(Meta(2), views, AsyncCheckpointer::HostCopy(views)));
  ASSERT_OK(ckpt.WaitIdle(std::chrono::seconds(10)));
  EXPECT_FALSE(ckpt.MaybeSave(Meta(3), views, AsyncCheckpointer::HostCopy(views)));
}

TEST(AsyncCheckpointerTest, ErrorsAreKeptNotThrownAndFinalSaveIsSynchronous) {
  auto store = NewMemoryStore();
  Model model;
  std::vector<TensorView> views = model.Views();
  ASSERT_OK(store->Save(Meta(100, /*generation=*/9), views, nullptr));  // a newer generation
  AsyncCheckpointerOptions o;
  o.checkpoint_steps = 1;
  AsyncCheckpointer ckpt(store.get(), o);
  ASSERT_TRUE(ckpt.MaybeSave(Meta(5, 3), views, AsyncCheckpointer::HostCopy(views)));
  Status s = ckpt.WaitIdle(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(ckpt.last_status().code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(ckpt.saves_completed(), 0);
  // A failing copy (e.g. a device error) is reported too.
  auto bad_copy = [](size_t, void*) { return Status::Internal("device lost"); };
  EXPECT_FALSE(ckpt.MaybeSave(Meta(6, 9), views, bad_copy));
  EXPECT_NE(ckpt.last_status().message().find("device lost"), std::string::npos);
  // Final save on shutdown: synchronous, visible on return.
  ASSERT_OK(ckpt.SaveNow(Meta(7, 9), views, AsyncCheckpointer::HostCopy(views)));
  std::vector<CheckpointMeta> all;
  ASSERT_OK(store->List(&all));
  EXPECT_EQ(all.back().step, 7);
}

}  // namespace
}  // namespace edl::ckpt
