// CheckpointStore: round trip, fencing, fingerprints, keep-K on both stores; on the RocksDB store
// also a flipped byte on disk, a writer process SIGKILLed mid-save, the LOCK wait, and NFS.
#include "edl/ckpt/checkpoint_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <thread>

#include <glog/logging.h>
#include <rocksdb/db.h>

#include "edl/ckpt/crc32c.h"
#include "tests/testutil.h"

namespace edl::ckpt {
namespace {

namespace fs = std::filesystem;
using edl::test::ScratchDir;

// A training state of random tensors of several dtypes and shapes; `seed` makes it distinct.
struct TestState {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> views;
};

TestState MakeState(uint32_t seed, size_t big_bytes = 3 << 20) {
  TestState s;
  std::mt19937 rng(seed);
  struct Spec {
    const char* name;
    DataType dtype;
    std::vector<int64_t> shape;
    size_t elem;
  };
  const int64_t big = static_cast<int64_t>(big_bytes / 4);
  const std::vector<Spec> specs = {
      {"conv1.weight", DataType::kFloat32, {big}, 4},
      {"bn1.running_mean", DataType::kFloat64, {3, 5}, 8},
      {"step_counter", DataType::kInt64, {1}, 8},
      {"empty", DataType::kFloat32, {0}, 4},
      {"momentum/conv1.weight", DataType::kBFloat16, {7, 11, 13}, 2},
  };
  s.bytes.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    size_t n = specs[i].elem;
    for (int64_t d : specs[i].shape) n *= d;
    s.bytes[i].resize(n);
    for (auto& b : s.bytes[i]) b = static_cast<uint8_t>(rng());
    s.views.push_back({specs[i].name, specs[i].dtype, specs[i].shape, s.bytes[i].data(), n});
  }
  return s;
}

CheckpointMeta MakeMeta(int64_t step, int64_t generation, const std::string& fp = "resnet-a") {
  CheckpointMeta m;
  m.step = step;
  m.epoch = step / 10;
  m.cursor = step * 256 + 7;
  m.generation = generation;
  m.world_size = 3;
  m.fingerprint = fp;
  m.extra_json = R"({"rng":[1,2,3],"note":"é"})";
  return m;
}

void ExpectSameState(const TestState& want, const LoadedCheckpoint& got) {
  ASSERT_EQ(got.meta.tensors.size(), want.views.size());
  for (size_t i = 0; i < want.views.size(); ++i) {
    const TensorRecord& t = got.meta.tensors[i];
    EXPECT_EQ(t.name, want.views[i].name);
    EXPECT_EQ(t.dtype, want.views[i].dtype);
    EXPECT_EQ(t.shape, want.views[i].shape);
    ASSERT_EQ(t.bytes, want.bytes[i].size());
    // memcmp of an empty tensor's null data() is undefined behaviour (UBSan), even for 0 bytes.
    if (t.bytes > 0) {
      EXPECT_EQ(0, std::memcmp(got.data[i].get(), want.bytes[i].data(), t.bytes)) << t.name;
    }
    EXPECT_EQ(t.crc32c, Crc32c(want.bytes[i].data(), t.bytes));
  }
}

// ---- both stores

class StoreTest : public testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<CheckpointStore> Open(int keep = 3) {
    if (GetParam() == "memory") return NewMemoryStore(keep);
    RocksDbStoreOptions o;
    o.dir = dir_.Join("store");
    o.keep_checkpoints = keep;
    o.chunk_bytes = 1 << 20;  // several chunks per big tensor
    return OpenRocksDbStore(o);
  }
  ScratchDir dir_{"ckpt"};
};

TEST_P(StoreTest, EmptyStoreIsNotFound) {
  auto store = Open();
  LoadedCheckpoint out;
  Status s = store->LoadLatest("resnet-a", &out);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
}

TEST_P(StoreTest, RoundTripIsBitExact) {
  auto store = Open();
  TestState state = MakeState(1);
  CheckpointMeta meta = MakeMeta(42, 5);
  meta.wall_time_micros = 1234567;
  int64_t id = 0;
  ASSERT_OK(store->Save(meta, state.views, &id));
  EXPECT_EQ(id, 1);
  LoadedCheckpoint out;
  ASSERT_OK(store->LoadLatest("resnet-a", &out));
  EXPECT_EQ(out.meta.id, 1);
  EXPECT_EQ(out.meta.step, 42);
  EXPECT_EQ(out.meta.epoch, 4);
  EXPECT_EQ(out.meta.cursor, 42 * 256 + 7);
  EXPECT_EQ(out.meta.generation, 5);
  EXPECT_EQ(out.meta.world_size, 3);
  EXPECT_EQ(out.meta.fingerprint, "resnet-a");
  EXPECT_EQ(out.meta.wall_time_micros, 1234567);
  EXPECT_EQ(out.meta.extra_json, meta.extra_json);
  ExpectSameState(state, out);
  ASSERT_NE(out.Find("step_counter"), nullptr);
  EXPECT_EQ(out.Find("nope"), nullptr);
}

TEST_P(StoreTest, KeepsTheLastKAndLoadsTheNewest) {
  auto store = Open(/*keep=*/2);
  for (int i = 1; i <= 4; ++i) {
    ASSERT_OK(store->Save(MakeMeta(i * 10, 1), MakeState(i).views, nullptr));
  }
  std::vector<CheckpointMeta> all;
  ASSERT_OK(store->List(&all));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id, 3);
  EXPECT_EQ(all[1].id, 4);
  LoadedCheckpoint out;
  ASSERT_OK(store->LoadLatest("resnet-a", &out));
  EXPECT_EQ(out.meta.step, 40);
  ExpectSameState(MakeState(4), out);
  LoadedCheckpoint old;
  EXPECT_TRUE(store->Read(1, &old).IsNotFound());
}

TEST_P(StoreTest, StaleGenerationWriterIsRefused) {
  auto store = Open();
  ASSERT_OK(store->Save(MakeMeta(100, 7), MakeState(1).views, nullptr));
  ASSERT_OK(store->Save(MakeMeta(101, 7), MakeState(2).views, nullptr));  // same generation: ok
  Status s = store->Save(MakeMeta(90, 6), MakeState(3).views, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("generation 6"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("generation 7"), std::string::npos) << s.message();
  LoadedCheckpoint out;
  ASSERT_OK(store->LoadLatest("resnet-a", &out));
  EXPECT_EQ(out.meta.step, 101);
  ASSERT_OK(store->Save(MakeMeta(102, 8), MakeState(4).views, nullptr));  // newer: ok
}

TEST_P(StoreTest, IncompatibleFingerprintIsAClearError) {
  auto store = Open();
  ASSERT_OK(store->Save(MakeMeta(1, 1, "resnet50-fp-A"), MakeState(1).views, nullptr));
  LoadedCheckpoint out;
  Status s = store->LoadLatest("resnet18-fp-B", &out);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("resnet50-fp-A"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("resnet18-fp-B"), std::string::npos) << s.message();
  EXPECT_TRUE(out.meta.tensors.empty());
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, testing::Values("memory", "rocksdb"));

// ---- checksum

TEST(Crc32cTest, MatchesKnownValuesAndSoftwarePath) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  std::vector<uint8_t> data(100000);
  std::mt19937 rng(3);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  // Split at odd places: Extend composes, and the 3-stream path equals the byte-wise one.
  const uint32_t whole = Crc32c(data.data(), data.size());
  uint32_t parts = Crc32cExtend(0, data.data(), 12345);
  parts = Crc32cExtend(parts, data.data() + 12345, data.size() - 12345);
  EXPECT_EQ(whole, parts);
  uint32_t bytewise = 0;
  for (uint8_t b : data) bytewise = Crc32cExtend(bytewise, &b, 1);
  EXPECT_EQ(whole, bytewise);
}

// ---- RocksDB store only

RocksDbStoreOptions Options(const std::string& dir, int keep = 3) {
  RocksDbStoreOptions o;
  o.dir = dir;
  o.keep_checkpoints = keep;
  return o;
}

// Flips one byte of `pattern`'s first occurrence (at offset +1000) in any *.sst under `dir`.
bool FlipByteOf(const std::string& dir, const uint8_t* pattern, size_t n) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".sst") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t pos = content.find(std::string(reinterpret_cast<const char*>(pattern), n));
    if (pos == std::string::npos) continue;
    f.clear();
    f.seekp(static_cast<std::streamoff>(pos + 1000));
    const char flipped = static_cast<char>(content[pos + 1000] ^ 0x10);
    f.write(&flipped, 1);
    return static_cast<bool>(f);
  }
  return false;
}

TEST(RocksDbStoreTest, FlippedByteIsNamedByVerifyAndLoadFallsBack) {
  ScratchDir dir("ckpt");
  auto store = OpenRocksDbStore(Options(dir.path()));
  TestState first = MakeState(1), second = MakeState(2);
  ASSERT_OK(store->Save(MakeMeta(10, 1), first.views, nullptr));
  ASSERT_OK(store->Save(MakeMeta(20, 1), second.views, nullptr));
  ASSERT_TRUE(FlipByteOf(dir.path(), second.bytes[0].data(), 64)) << "tensor bytes not found";

  VerifyReport report;
  ASSERT_OK(store->Verify(2, &report));
  ASSERT_EQ(report.corrupt.size(), 1u);
  EXPECT_NE(report.corrupt[0].find("conv1.weight"), std::string::npos) << report.corrupt[0];
  ASSERT_OK(store->Verify(1, &report));
  EXPECT_TRUE(report.corrupt.empty());

  LoadedCheckpoint out;
  ASSERT_OK(store->LoadLatest("resnet-a", &out));
  EXPECT_EQ(out.meta.id, 1);  // fell back past the corrupt latest
  ExpectSameState(first, out);
}

// Sees the store's "locked by another writer; waiting" log line (the observable sign that a save
// is waiting for the LOCK).
class LockWaitSink : public google::LogSink {
 public:
  void send(google::LogSeverity, const char*, const char*, int, const google::LogMessageTime&,
            const char* message, size_t len) override {
    if (std::string(message, len).find("locked by another writer; waiting") == std::string::npos)
      return;
    std::lock_guard<std::mutex> lock(mu_);
    seen_ = true;
    cv_.notify_all();
  }
  // Bounded: the save times out after its lock_timeout anyway.
  void WaitForLockWait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(120), [&] { return seen_; });
  }
  bool seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool seen_ = false;
};

TEST(RocksDbStoreTest, WriterWaitsForTheLockThenTimesOutClearly) {
  ScratchDir dir("ckpt");
  auto store = OpenRocksDbStore(Options(dir.path()));
  ASSERT_OK(store->Save(MakeMeta(1, 1), MakeState(1).views, nullptr));
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.path(), &raw).ok());  // holds LOCK
  RocksDbStoreOptions o = Options(dir.path());
  o.lock_timeout = std::chrono::milliseconds(300);
  Status s = OpenRocksDbStore(o)->Save(MakeMeta(2, 1), MakeState(2).views, nullptr);
  EXPECT_TRUE(s.IsTimeout()) << s.ToString();
  EXPECT_NE(s.message().find("locked by another writer"), std::string::npos) << s.message();
  // Readers are not blocked by a writer.
  std::vector<CheckpointMeta> all;
  ASSERT_OK(store->List(&all));
  EXPECT_EQ(all.size(), 1u);
  // Released during a longer wait: the save goes through. The LOCK is released only once the
  // save has logged that it waits for it.
  LockWaitSink sink;
  google::AddLogSink(&sink);
  std::thread release([raw, &sink] {
    sink.WaitForLockWait();
    raw->Close();
    delete raw;
  });
  EXPECT_OK(store->Save(MakeMeta(2, 1), MakeState(2).views, nullptr));
  release.join();
  google::RemoveLogSink(&sink);
  EXPECT_TRUE(sink.seen()) << "the save never waited for the LOCK";
}

// Readers (a joiner's cold start, `edl ckpt list`, a test's poll) open the store read-only while a
// trainer saves and prunes it, deleting the files of dropped checkpoints. Each reader sees a whole
// store: every List and every load of the newest checkpoint succeeds, whatever it interleaves with.
// A store missing a table file, or whose CURRENT names a MANIFEST that is gone, is reported as
// damaged at once: no writer changed it, so the retry meant for a concurrent prune (lock_timeout,
// here far beyond the test's own timeout) would wait for nothing.
TEST(RocksDbStoreTest, DamageIsToldAtOnceNotWaitedOutAsAPrune) {
  for (const bool manifest : {false, true}) {
    SCOPED_TRACE(manifest ? "CURRENT names a missing MANIFEST" : "a table file is missing");
    ScratchDir dir("ckpt");
    {
      auto writer = OpenRocksDbStore(Options(dir.path()));
      ASSERT_OK(writer->Save(MakeMeta(10, 1), MakeState(1).views, nullptr));
    }
    bool removed = false;
    for (const auto& e : fs::directory_iterator(dir.path())) {
      const std::string name = e.path().filename().string();
      if (!removed &&
          (manifest ? name.rfind("MANIFEST-", 0) == 0 : e.path().extension() == ".sst")) {
        fs::remove(e.path());
        removed = true;
      }
    }
    ASSERT_TRUE(removed);
    RocksDbStoreOptions o = Options(dir.path());
    o.lock_timeout = std::chrono::hours(1);
    auto reader = OpenRocksDbStore(o);
    std::vector<CheckpointMeta> all;
    const Status s = reader->List(&all);
    EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
    EXPECT_NE(s.message().find("is damaged"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("restore it from a copy"), std::string::npos) << s.ToString();
  }
}

TEST(RocksDbStoreTest, ReadersDuringSavesAndPrunesAlwaysSeeAWholeStore) {
  ScratchDir dir("ckpt");
  auto writer = OpenRocksDbStore(Options(dir.path(), /*keep=*/1));
  ASSERT_OK(writer->Save(MakeMeta(1, 1), MakeState(1, 64 << 10).views, nullptr));
  std::atomic<bool> done{false};
  std::atomic<int> lists{0}, loads{0};
  std::thread reader([&] {
    auto store = OpenRocksDbStore(Options(dir.path(), /*keep=*/1));
    while (!done.load()) {
      std::vector<CheckpointMeta> all;
      Status s = store->List(&all);
      EXPECT_OK(s);
      if (!s.ok()) return;
      EXPECT_TRUE(all.size() == 1 || all.size() == 2) << all.size();  // 2 between save and prune
      ++lists;
      LoadedCheckpoint got;
      s = store->LoadLatest("", &got);
      EXPECT_OK(s);
      if (!s.ok()) return;
      ++loads;
    }
  });
  // Saves go on until the reader has opened the store many times during them.
  for (int i = 2; i <= 400 && loads.load() < 50; ++i) {
    ASSERT_OK(writer->Save(MakeMeta(i, 1), MakeState(i, 64 << 10).views, nullptr));
  }
  done.store(true);
  reader.join();
  EXPECT_GT(lists.load(), 0);
}

TEST(RocksDbStoreTest, TakesBackDiskSpaceOfDroppedCheckpoints) {
  ScratchDir dir("ckpt");
  auto store = OpenRocksDbStore(Options(dir.path(), /*keep=*/1));
  auto disk_bytes = [&] {
    uint64_t total = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
      if (e.is_regular_file()) total += e.file_size();
    }
    return total;
  };
  for (int i = 1; i <= 5; ++i) {
    ASSERT_OK(store->Save(MakeMeta(i, 1), MakeState(i, 8 << 20).views, nullptr));
  }
  // One 8 MB checkpoint kept: the store holds well under two checkpoints' worth.
  EXPECT_LT(disk_bytes(), 14u << 20) << "old checkpoints' files were not deleted";
}

// ---- a writer process killed mid-save

// Its output goes to <dir>.writer.log, beside the store in the test's scratch directory (checked
// for sanitizer reports with the directory).
pid_t StartWriter(const std::string& dir, int mb) {
  const std::string log = dir + ".writer.log";
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(out, 1);
    dup2(out, 2);
    execl(CKPT_BENCH, CKPT_BENCH, "writer", "--dir", dir.c_str(), "--mb",
          std::to_string(mb).c_str(), "--seconds", "600", static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits until the store lists at least `n` checkpoints (bounded).
bool WaitForCheckpoints(CheckpointStore* store, size_t n, int64_t* newest) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < end) {
    std::vector<CheckpointMeta> all;
    if (store->List(&all).ok() && all.size() >= n) {
      *newest = all.back().id;
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The id of the save whose data file in the store's ingest directory (FORMAT.md: a save writes
// its SST files there before ingesting them) holds at least `min_bytes`; 0 when none does.
int64_t SaveInFlight(const std::string& dir, uintmax_t min_bytes) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir + "/ingest", ec)) {
    const std::string name = e.path().filename().string();
    const size_t dash = name.find("-data.sst");
    if (dash == std::string::npos || dash == 0) continue;
    const uintmax_t size = fs::file_size(e.path(), ec);
    if (!ec && size >= min_bytes) return std::stoll(name.substr(0, dash));
  }
  return 0;
}

// Rounds kill the writer while it writes the data file of a save, each at a later point of that
// file (a size threshold), and prove it: after the kill the partial file of a save newer than
// every listed checkpoint is still there. A kill that raced past the file (the save finished
// between the look and the kill) is retried.
void KillWriterMidSaveAndCheck(const std::string& dir) {
  RocksDbStoreOptions o = Options(dir);
  o.lock_timeout = std::chrono::milliseconds(60000);
  auto store = OpenRocksDbStore(o);
  constexpr int kMb = 96;
  for (int round = 0; round < 3; ++round) {
    const uintmax_t threshold = (round * kMb / 3 + 1) * (uintmax_t{1} << 20);
    bool proven = false;
    for (int attempt = 0; attempt < 10 && !proven; ++attempt) {
      pid_t pid = StartWriter(dir, kMb);
      ASSERT_GT(pid, 0);
      int64_t newest = 0;
      const bool saved = WaitForCheckpoints(store.get(), 1, &newest);
      int64_t in_flight = 0;
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (saved && in_flight <= newest && std::chrono::steady_clock::now() < end) {
        in_flight = SaveInFlight(dir, threshold);
        if (in_flight <= newest) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      kill(pid, SIGKILL);
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(saved) << "writer saved nothing within 120 s";
      ASSERT_TRUE(WIFSIGNALED(status));
      // Proof that the kill landed mid-write: the killed save's partial data file is still there
      // (only the next writer's open clears it) and its id is newer than every checkpoint.
      std::vector<CheckpointMeta> all;
      ASSERT_OK(store->List(&all));
      const int64_t committed = all.empty() ? 0 : all.back().id;
      const int64_t left = SaveInFlight(dir, 1);
      proven = left > committed && left == in_flight;
      std::cout << "round " << round << " attempt " << attempt << ": killed the writer "
                << (proven
                        ? "while it was writing the data file of checkpoint " + std::to_string(left)
                        : std::string("after its save finished (retrying)"))
                << "; newest checkpoint " << committed << "\n";

      LoadedCheckpoint out;
      ASSERT_OK(store->LoadLatest("writer", &out));
      EXPECT_EQ(out.meta.id, committed);
      EXPECT_GE(out.meta.id, newest);
      for (const auto& m : all) {
        VerifyReport report;
        ASSERT_OK(store->Verify(m.id, &report));
        EXPECT_TRUE(report.corrupt.empty()) << "checkpoint " << m.id << ": " << report.corrupt[0];
      }
      // The killed writer's LOCK is gone with it: a new writer opens the store at once.
      CheckpointMeta meta = MakeMeta(1, out.meta.generation);
      meta.fingerprint = "writer";
      ASSERT_OK(store->Save(meta, MakeState(9).views, nullptr));
    }
    EXPECT_TRUE(proven) << "round " << round << ": no kill landed while a data file was written";
  }
}

TEST(RocksDbStoreTest, WriterKilledMidSaveLeavesThePreviousCheckpointWhole) {
  ScratchDir dir("ckpt");
  KillWriterMidSaveAndCheck(dir.Join("store"));
}

// ---- NFS over loopback, where the machine allows it

// Why this machine cannot mount NFS over loopback, or "". The store must run on a kernel NFS
// mount (RocksDB takes its LOCK with fcntl locks, which an NFS client forwards to the server's
// lock manager); no userspace client can stand in for that, so without the kernel's NFS client
// the test cannot run. The server side may be the kernel's nfsd (nfs-kernel-server).
std::string NfsUnavailableReason() {
  if (geteuid() != 0) return "not root (mounting NFS needs root)";
  std::ifstream fsl("/proc/filesystems");
  std::string all((std::istreambuf_iterator<char>(fsl)), std::istreambuf_iterator<char>());
  if (all.find("\tnfs4\n") == std::string::npos && all.find("\tnfs\n") == std::string::npos &&
      system("modprobe nfs >/dev/null 2>&1") != 0) {
    return "this kernel has no NFS client: /proc/filesystems lists no nfs/nfs4 and `modprobe nfs` "
           "fails (built without CONFIG_NFS_FS, no loadable modules), so nothing can be mounted "
           "over NFS here; a userspace NFS server (nfs-ganesha) would not help without the client";
  }
  if (all.find("nfsd") == std::string::npos && system("modprobe nfsd >/dev/null 2>&1") != 0) {
    return "this kernel has no NFS server (no nfsd in /proc/filesystems and `modprobe nfsd` fails)";
  }
  if (system("command -v exportfs >/dev/null 2>&1") != 0 ||
      system("command -v mount.nfs >/dev/null 2>&1") != 0) {
    return "exportfs or mount.nfs not installed (apt-get install nfs-kernel-server nfs-common)";
  }
  return "";
}

TEST(RocksDbStoreTest, WorksOnAnNfsMountOverLoopback) {
  const std::string reason = NfsUnavailableReason();
  if (!reason.empty()) {
    std::cout << "NFS test skipped: " << reason << "\n";
    GTEST_SKIP() << reason;
  }
  ScratchDir exported("ckpt-nfs-export"), mnt("ckpt-nfs-mnt");
  const std::string spec = "127.0.0.1:" + exported.path();
  ASSERT_EQ(system(("exportfs -o rw,sync,no_root_squash,insecure,fsid=" + std::to_string(getpid()) +
                    " " + spec)
                       .c_str()),
            0);
  const int mounted =
      system(("mount -t nfs -o vers=4.2,hard,timeo=50 " + spec + " " + mnt.path()).c_str());
  if (mounted == 0) {
    auto store = OpenRocksDbStore(Options(mnt.Join("store")));
    TestState state = MakeState(1);
    EXPECT_OK(store->Save(MakeMeta(5, 1), state.views, nullptr));
    LoadedCheckpoint out;
    EXPECT_OK(store->LoadLatest("resnet-a", &out));
    ExpectSameState(state, out);
    KillWriterMidSaveAndCheck(mnt.Join("kill"));
    EXPECT_EQ(system(("umount " + mnt.path()).c_str()), 0);
  }
  system(("exportfs -u " + spec).c_str());
  ASSERT_EQ(mounted, 0) << "mount of " << spec << " failed";
}

// A store whose metadata says tensor 0 has `bytes` bytes, whatever is stored (damaged or forged
// metadata); everything else goes to the real store.
class InflatedMetaStore : public CheckpointStore {
 public:
  InflatedMetaStore(CheckpointStore* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  Status Save(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
              int64_t* id) override {
    return base_->Save(meta, tensors, id);
  }
  Status List(std::vector<CheckpointMeta>* out) override {
    EDL_RETURN_IF_ERROR(base_->List(out));
    for (CheckpointMeta& m : *out) m.tensors[0].bytes = bytes_;
    return Status::OK();
  }
  Status ReadTensors(const CheckpointMeta& meta, const std::function<void*(size_t)>& dst_for,
                     const std::function<Status(size_t)>& done) override {
    return base_->ReadTensors(meta, dst_for, done);
  }
  std::string Describe() const override { return base_->Describe(); }

 private:
  CheckpointStore* const base_;
  const uint64_t bytes_;
};

TEST(RocksDbStoreTest, MetadataBytesAreNotTrustedForAnAllocation) {
  ScratchDir dir("ckpt");
  auto store = OpenRocksDbStore(Options(dir.path()));
  TestState state = MakeState(3);
  ASSERT_OK(store->Save(MakeMeta(10, 1), state.views, nullptr));
  // Past any allocation (2^62), and one the allocator may grant but the store does not hold.
  for (uint64_t bytes : {uint64_t{1} << 62, uint64_t{1} << 36, state.bytes[0].size() + 1}) {
    SCOPED_TRACE(bytes);
    InflatedMetaStore bad(store.get(), bytes);
    LoadedCheckpoint out;
    Status s = bad.Read(1, &out);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find("conv1.weight"), std::string::npos) << s.ToString();
    VerifyReport report;
    ASSERT_OK(bad.Verify(1, &report));
    ASSERT_FALSE(report.corrupt.empty());
    EXPECT_NE(report.corrupt[0].find("conv1.weight"), std::string::npos) << report.corrupt[0];
  }
  LoadedCheckpoint out;
  ASSERT_OK(store->Read(1, &out));  // the honest metadata still reads
  ExpectSameState(state, out);
}

}  // namespace
}  // namespace edl::ckpt
