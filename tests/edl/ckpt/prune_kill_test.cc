// RocksDB checkpoint store: a writer SIGKILLed while it prunes old checkpoints never leaves a
// listed checkpoint whose tensors are gone (FORMAT.md: the metadata goes before the data), the
// next writer's pruning removes what the killed one left unlisted, and `edl ckpt verify` agrees
// with List. Also the fence's message says which way it points: a stale writer of the same job,
// or a store that was ahead of the job before its writer started.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/db.h>

#include "edl/base/clock.h"
#include "edl/ckpt/checkpoint_store.h"
#include "tests/testutil.h"

namespace edl::ckpt {
namespace {

namespace fs = std::filesystem;
using edl::test::ScratchDir;

RocksDbStoreOptions Options(const std::string& dir, int keep = 2) {
  RocksDbStoreOptions o;
  o.dir = dir;
  o.keep_checkpoints = keep;
  o.lock_timeout = std::chrono::milliseconds(60000);
  return o;
}

std::vector<TensorView> State(std::vector<float>* storage, float value) {
  storage->assign(64 << 10, value);
  return {{"w",
           DataType::kFloat32,
           {static_cast<int64_t>(storage->size())},
           storage->data(),
           storage->size() * sizeof(float)}};
}

CheckpointMeta Meta(int64_t step, int64_t generation) {
  CheckpointMeta m;
  m.step = step;
  m.generation = generation;
  m.world_size = 1;
  m.fingerprint = "writer";  // the fingerprint ckpt_bench's writer uses
  return m;
}

pid_t StartWriter(const std::string& dir) {
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execl(CKPT_BENCH, CKPT_BENCH, "writer", "--dir", dir.c_str(), "--mb", "2", "--seconds", "600",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits (bounded) for the deletion of a table file (*.sst) at the top of the store directory: a
// writer deletes one only while it prunes (its ingested files stay until pruned; the ingest/
// directory is not watched). True when one was seen.
bool WaitForPruneDeletion(int inotify_fd) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  alignas(inotify_event) char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{inotify_fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;
    const ssize_t n = ::read(inotify_fd, buf, sizeof(buf));
    for (ssize_t off = 0; off < n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buf + off);
      const std::string name = e->len > 0 ? e->name : "";
      if ((e->mask & IN_DELETE) && name.size() > 4 && name.substr(name.size() - 4) == ".sst") {
        return true;
      }
      off += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
    }
  }
  return false;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Ids of the checkpoints whose tensor chunks are in the store (`data/<id>/...` keys, FORMAT.md).
std::set<int64_t> DataIds(const std::string& dir) {
  std::set<int64_t> ids;
  rocksdb::DB* raw = nullptr;
  rocksdb::Options o;
  EXPECT_TRUE(rocksdb::DB::OpenForReadOnly(o, dir, &raw).ok());
  if (raw == nullptr) return ids;
  std::unique_ptr<rocksdb::DB> db(raw);
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("data/"); it->Valid() && it->key().starts_with("data/"); it->Next()) {
    ids.insert(std::stoll(it->key().ToString().substr(5, 16)));
  }
  return ids;
}

// The listed checkpoints, each verified: the store holds every one it lists.
std::set<int64_t> ListedAndWhole(CheckpointStore* store) {
  std::vector<CheckpointMeta> all;
  EXPECT_OK(store->List(&all));
  std::set<int64_t> ids;
  for (const CheckpointMeta& m : all) {
    VerifyReport report;
    Status s = store->Verify(m.id, &report);
    EXPECT_TRUE(s.ok()) << "listed checkpoint " << m.id << ": " << s.ToString();
    EXPECT_TRUE(report.corrupt.empty())
        << "listed checkpoint " << m.id << ": " << report.corrupt[0];
    ids.insert(m.id);
  }
  return ids;
}

TEST(CheckpointPruneTest, WriterKilledWhilePruningLeavesNoListedCheckpointWithoutItsData) {
  ScratchDir dir("ckpt-prune");
  const std::string store_dir = dir.Join("store");
  fs::create_directories(store_dir);
  auto store = OpenRocksDbStore(Options(store_dir));
  const int inotify_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  ASSERT_GE(inotify_fd, 0);
  ASSERT_GE(inotify_add_watch(inotify_fd, store_dir.c_str(), IN_DELETE), 0);
  std::vector<float> storage;
  constexpr int kRounds = 8;
  for (int round = 0; round < kRounds; ++round) {
    const pid_t pid = StartWriter(store_dir);
    ASSERT_GT(pid, 0);
    // The writer keeps 2: from its third save on (its first, after round 0) every save prunes.
    const bool seen = WaitForPruneDeletion(inotify_fd);
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(seen) << "round " << round << ": the writer pruned nothing within 120 s";
    ASSERT_TRUE(WIFSIGNALED(status)) << "round " << round << ": the writer exited by itself";
    const std::set<int64_t> listed = ListedAndWhole(store.get());
    ASSERT_FALSE(listed.empty()) << "round " << round;
    const std::string cmd = edl::test::EdlBinary() + " ckpt verify --checkpoint_dir " + store_dir +
                            " > " + dir.Join("verify.out") + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << "round " << round << ": `edl ckpt verify` fails:\n"
                                           << ReadAll(dir.Join("verify.out"));
    // The next save prunes what the killed writer left unlisted: only listed ids hold data.
    ASSERT_OK(store->Save(Meta(1000 + round, 1), State(&storage, round), nullptr));
    const std::set<int64_t> after = ListedAndWhole(store.get());
    for (int64_t id : DataIds(store_dir)) {
      EXPECT_TRUE(after.count(id))
          << "round " << round << ": data of unlisted checkpoint " << id << " was left behind";
    }
    // Drain the events of the test's own save before the next round watches again.
    char drain[4096];
    while (::read(inotify_fd, drain, sizeof(drain)) > 0) {
    }
  }
  ::close(inotify_fd);
}

// A newer generation saved after this writer started: the writer is stale.
TEST(CheckpointFenceTest, StaleWriterIsToldItIsStale) {
  ScratchDir dir("ckpt-fence");
  auto stale = OpenRocksDbStore(Options(dir.Join("store")));
  auto current = OpenRocksDbStore(Options(dir.Join("store")));
  std::vector<float> storage;
  ASSERT_OK(current->Save(Meta(10, 5), State(&storage, 1), nullptr));
  Status s = stale->Save(Meta(9, 4), State(&storage, 2), nullptr);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("generation 4"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("generation 5"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("this writer is stale"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("--checkpoint_dir"), std::string::npos) << s.message();
}

// The store held a checkpoint of a higher generation before the writer started (an earlier run of
// the job; this one's server began with fresh state): the fix is the server's --checkpoint_dir.
TEST(CheckpointFenceTest, StoreAheadOfANewJobNamesTheServersCheckpointDir) {
  ScratchDir dir("ckpt-fence");
  std::vector<float> storage;
  {
    auto earlier_run = OpenRocksDbStore(Options(dir.Join("store")));
    ASSERT_OK(earlier_run->Save(Meta(500, 40), State(&storage, 1), nullptr));
  }
  std::vector<CheckpointMeta> all;
  ASSERT_OK(OpenRocksDbStore(Options(dir.Join("store")))->List(&all));
  ASSERT_EQ(all.size(), 1u);
  while (Clock::Real()->WallMicros() <= all[0].wall_time_micros) std::this_thread::yield();
  auto new_job = OpenRocksDbStore(Options(dir.Join("store")));
  Status s = new_job->Save(Meta(20, 3), State(&storage, 2), nullptr);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("generation 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("generation 40"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("before this writer started"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--checkpoint_dir"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("stale"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace edl::ckpt
