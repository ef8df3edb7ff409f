// ckpt_bench: measurements for bench/checkpoint.sh, and the writer process the SIGKILL test kills.
//
//   ckpt_bench save-load --dir D [--method sst|writebatch|blob] [--chunk_mb N] [--repeats N]
//                        [--direct_reads] [--direct_writes]
//       ResNet-50-sized state (25.6M params + momentum + BN running stats, fp32, ~205 MB): save and
//       load through the store next to a raw sequential write+fsync and read of the same bytes, in
//       the same run, dropping the page cache before every read when root.
//   ckpt_bench stall --dir D [--steps N] [--every K]
//       The whole cost of async saves to the training thread: a step loop whose compute uses every
//       core (one FMA kernel thread per core, like a real step's intra-op threads), timed from the
//       step boundary (MaybeSave, i.e. the synchronous snapshot copy included) to the end of the
//       step, with a save due every K steps, against the same loop with no saves, in one run.
//       Every save's background write falls inside the timed steps (a write still running after
//       the last step is waited for on the clock and charged to the saves).
//   ckpt_bench writer --dir D --mb N [--generation G] [--seconds S]
//       Saves an N MB state in a loop (step = 1, 2, ...) until killed or S seconds pass.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <glog/logging.h>

#include "edl/base/clock.h"
#include "edl/ckpt/async_checkpointer.h"
#include "edl/ckpt/checkpoint_store.h"
#include "edl/ckpt/crc32c.h"

namespace {

using namespace edl::ckpt;  // NOLINT

// ---- a ResNet-50 v1.5 state: parameters, momentum for each, BN running statistics

struct State {
  std::vector<TensorView> views;
  std::vector<std::unique_ptr<float[]>> storage;
  size_t bytes = 0;
};

void AddTensor(State* s, const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  s->storage.emplace_back(new float[n]);
  float* p = s->storage.back().get();
  std::mt19937 rng(static_cast<uint32_t>(s->views.size() + 1));
  std::normal_distribution<float> dist(0.f, 0.05f);
  for (int64_t i = 0; i < n; ++i) p[i] = dist(rng);
  s->views.push_back({name, edl::DataType::kFloat32, shape, p, n * sizeof(float)});
  s->bytes += n * sizeof(float);
}

State ResNet50State() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> params, stats;
  auto conv = [&](const std::string& n, int64_t o, int64_t i, int64_t k) {
    params.push_back({n + ".weight", {o, i, k, k}});
  };
  auto bn = [&](const std::string& n, int64_t c) {
    params.push_back({n + ".weight", {c}});
    params.push_back({n + ".bias", {c}});
    stats.push_back({n + ".running_mean", {c}});
    stats.push_back({n + ".running_var", {c}});
  };
  conv("conv1", 64, 3, 7);
  bn("bn1", 64);
  const int blocks[4] = {3, 4, 6, 3};
  int64_t in = 64;
  for (int l = 0; l < 4; ++l) {
    const int64_t w = 64 << l;
    for (int b = 0; b < blocks[l]; ++b) {
      const std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(b);
      conv(p + ".conv1", w, in, 1);
      bn(p + ".bn1", w);
      conv(p + ".conv2", w, w, 3);
      bn(p + ".bn2", w);
      conv(p + ".conv3", 4 * w, w, 1);
      bn(p + ".bn3", 4 * w);
      if (b == 0) {
        conv(p + ".downsample.0", 4 * w, in, 1);
        bn(p + ".downsample.1", 4 * w);
      }
      in = 4 * w;
    }
  }
  params.push_back({"fc.weight", {1000, 2048}});
  params.push_back({"fc.bias", {1000}});
  State s;
  for (auto& [n, shape] : params) AddTensor(&s, n, shape);
  for (auto& [n, shape] : params) AddTensor(&s, "momentum/" + n, shape);
  for (auto& [n, shape] : stats) AddTensor(&s, n, shape);
  return s;
}

State FlatState(size_t mb) {
  State s;
  const int64_t per = (4 << 20) / sizeof(float);
  for (size_t i = 0; i < mb / 4 + 1; ++i) AddTensor(&s, "t" + std::to_string(i), {per});
  return s;
}

// ---- helpers

std::map<std::string, std::string> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) continue;
    k = k.substr(2);
    if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      a[k] = argv[++i];
    } else {
      a[k] = "1";
    }
  }
  return a;
}

double Now() { return edl::MicrosToSeconds(edl::Clock::Real()->NowMicros()); }

bool DropCaches() {
  sync();
  int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd < 0) return false;
  bool ok = write(fd, "3", 1) == 1;
  close(fd);
  return ok;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Check(const edl::Status& s, const char* what) {
  if (!s.ok()) {
    fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    exit(1);
  }
}

double RawWrite(const std::string& path, const State& s) {
  unlink(path.c_str());  // a fresh file, as the store writes fresh SST files
  const double t0 = Now();
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) exit(1);
  for (const auto& v : s.views) {
    const char* p = static_cast<const char*>(v.data);
    for (size_t off = 0; off < v.bytes;) {
      ssize_t n = write(fd, p + off, v.bytes - off);
      if (n <= 0) exit(1);
      off += n;
    }
  }
  fsync(fd);
  close(fd);
  return Now() - t0;
}

double RawRead(const std::string& path, size_t bytes) {
  std::unique_ptr<char[]> buf(new char[bytes]);
  const double t0 = Now();
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) exit(1);
  for (size_t off = 0; off < bytes;) {
    ssize_t n = read(fd, buf.get() + off, std::min<size_t>(4 << 20, bytes - off));
    if (n <= 0) exit(1);
    off += n;
  }
  close(fd);
  return Now() - t0;
}

RocksDbStoreOptions StoreOptions(std::map<std::string, std::string>& a, const std::string& dir) {
  RocksDbStoreOptions o;
  o.dir = dir;
  o.keep_checkpoints = 2;
  const std::string m = a.count("method") ? a["method"] : "sst";
  o.save_method = m == "writebatch" ? SaveMethod::kWriteBatch
                  : m == "blob"     ? SaveMethod::kBlobWriteBatch
                                    : SaveMethod::kSstIngest;
  if (a.count("chunk_mb")) o.chunk_bytes = std::stoul(a["chunk_mb"]) << 20;
  o.direct_reads = a.count("direct_reads") > 0;
  o.direct_writes = a.count("direct_writes") > 0;
  if (a.count("read_threads")) o.read_threads = std::stoi(a["read_threads"]);
  return o;
}

int SaveLoad(std::map<std::string, std::string>& a) {
  const std::string dir = a["dir"];
  std::filesystem::create_directories(dir);
  const int repeats = a.count("repeats") ? std::stoi(a["repeats"]) : 3;
  State s = ResNet50State();
  const double mb = s.bytes / 1e6;
  printf("state: %zu tensors, %.1f MB; crc32c %s\n", s.views.size(), mb,
         edl::ckpt::Crc32cHardware() ? "sse4.2" : "software");
  const bool dropped = DropCaches();
  printf("page cache dropped before reads: %s\n", dropped ? "yes" : "no (not root?)");
  auto store = OpenRocksDbStore(StoreOptions(a, dir + "/store"));
  std::vector<double> raw_w, raw_r, our_w, our_r;
  CheckpointMeta meta;
  meta.fingerprint = "resnet50";
  for (int r = 0; r < repeats; ++r) {
    raw_w.push_back(RawWrite(dir + "/raw.bin", s));
    meta.step = r;
    double t0 = Now();
    Check(store->Save(meta, s.views, nullptr), "save");
    our_w.push_back(Now() - t0);
    DropCaches();
    raw_r.push_back(RawRead(dir + "/raw.bin", s.bytes));
    DropCaches();
    LoadedCheckpoint loaded;
    t0 = Now();
    Check(store->LoadLatest("resnet50", &loaded), "load");
    our_r.push_back(Now() - t0);
    printf("round %d: raw write %.3fs, save %.3fs, raw read %.3fs, load %.3fs\n", r, raw_w.back(),
           our_w.back(), raw_r.back(), our_r.back());
  }
  std::filesystem::remove(dir + "/raw.bin");
  const double sw = mb / Median(our_w), rw = mb / Median(raw_w);
  const double sr = mb / Median(our_r), rr = mb / Median(raw_r);
  printf("RESULT ckpt_save_MBps ours=%.0fMB/s ref=%.0fMB/s ratio=%.2f\n", sw, rw, sw / rw);
  printf("RESULT ckpt_load_MBps ours=%.0fMB/s ref=%.0fMB/s ratio=%.2f\n", sr, rr, sr / rr);
  return 0;
}

// A fixed compute kernel: FMAs over a 64 KiB (L1/L2-resident) array.
float Kernel(std::vector<float>& x, int iters) {
  float acc = 0;
  for (int it = 0; it < iters; ++it) {
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = x[i] * 0.999f + 0.001f;
      acc += x[i];
    }
  }
  return acc;
}

// One step of compute on every core: the kernel on each of `arrays`, one thread each, joined.
float ParallelStep(std::vector<std::vector<float>>& arrays, int iters) {
  std::vector<float> out(arrays.size());
  std::vector<std::thread> threads;
  for (size_t t = 1; t < arrays.size(); ++t) {
    threads.emplace_back([&, t] { out[t] = Kernel(arrays[t], iters); });
  }
  out[0] = Kernel(arrays[0], iters);
  for (auto& th : threads) th.join();
  float acc = 0;
  for (float v : out) acc += v;
  return acc;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

int Stall(std::map<std::string, std::string>& a) {
  const std::string dir = a["dir"];
  const int steps = a.count("steps") ? std::stoi(a["steps"]) : 40;
  const int every = a.count("every") ? std::max(1, std::stoi(a["every"])) : 5;
  State s = ResNet50State();
  auto store = OpenRocksDbStore(StoreOptions(a, dir + "/store"));
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::vector<float>> arrays(cores, std::vector<float>(16384, 1.f));
  // Calibrate to ~100 ms per step with every core busy.
  int iters = 50;
  double t0 = Now();
  volatile float sink = ParallelStep(arrays, iters);
  const double per = (Now() - t0) / iters;
  iters = std::max(1, static_cast<int>(0.1 / per));
  AsyncCheckpointerOptions o;
  o.checkpoint_steps = every;
  AsyncCheckpointer ckpt(store.get(), o);
  CheckpointMeta meta;
  meta.fingerprint = "resnet50";
  // Interleave baseline and save loops in blocks so drift in the machine's load hits both alike.
  // Every save's write runs inside the timed window: a save falls due on the first step of each
  // period of `every` steps (step numbers start at `every`), so each block's last save has the
  // rest of its period to write, and whatever write is still running when the block's last step
  // ends is waited for on the clock and charged to the saves (drain).
  std::vector<double> base, with_saves, snapshot;
  double drain = 0;
  int64_t step = every - 1;
  for (int block = 0; block < 2; ++block) {
    for (int i = 0; i < steps / 2; ++i) {
      t0 = Now();
      sink = sink + ParallelStep(arrays, iters);
      base.push_back(Now() - t0);
    }
    for (int i = 0; i < steps / 2; ++i) {
      meta.step = ++step;
      t0 = Now();  // the step boundary: the snapshot copy counts against the training thread
      if (ckpt.MaybeSave(meta, s.views, AsyncCheckpointer::HostCopy(s.views))) {
        snapshot.push_back(ckpt.last_snapshot_seconds());
      }
      sink = sink + ParallelStep(arrays, iters);
      with_saves.push_back(Now() - t0);
    }
    t0 = Now();
    Check(ckpt.WaitIdle(std::chrono::minutes(2)), "async save");
    drain += Now() - t0;
  }
  const double b = Mean(base) * 1e3;
  const double f = (Mean(with_saves) + drain / std::max<size_t>(1, with_saves.size())) * 1e3;
  const int64_t saves = ckpt.saves_completed();
  printf(
      "compute: %u threads, %d steps without saves, %zu with a save due every %d steps; "
      "%lld saves done, %lld skipped (busy); writes still running after the last step: %.1f ms "
      "in all, charged to the saves\n",
      cores, static_cast<int>(base.size()), with_saves.size(), every, static_cast<long long>(saves),
      static_cast<long long>(ckpt.saves_skipped()), drain * 1e3);
  printf(
      "snapshot copy on the training thread (once per save, %.0f MB): median %.1f ms; "
      "background write %.2f s; whole cost per save to the training thread %.1f ms\n",
      s.bytes / 1e6, Median(snapshot) * 1e3, ckpt.last_write_seconds(),
      saves > 0 ? (f - b) * with_saves.size() / saves : 0.0);
  printf(
      "RESULT ckpt_mean_step_ms_with_saves_every_%d ours=%.1fms ref=%.1fms ratio=%.3f "
      "(stall %.1f%% of training time)\n",
      every, f, b, b / f, (f - b) / b * 100);
  return 0;
}

int Writer(std::map<std::string, std::string>& a) {
  State s = FlatState(a.count("mb") ? std::stoul(a["mb"]) : 32);
  RocksDbStoreOptions o;
  o.dir = a["dir"];
  o.keep_checkpoints = 2;
  auto store = OpenRocksDbStore(o);
  CheckpointMeta meta;
  meta.fingerprint = "writer";
  meta.generation = a.count("generation") ? std::stoll(a["generation"]) : 1;
  const double seconds = a.count("seconds") ? std::stod(a["seconds"]) : 120;
  const double start = Now();
  for (int64_t step = 1; Now() - start < seconds; ++step) {
    meta.step = step;
    for (auto& v : s.views) static_cast<float*>(const_cast<void*>(v.data))[0] = step;
    int64_t id = 0;
    Check(store->Save(meta, s.views, &id), "writer save");
    printf("saved %lld\n", static_cast<long long>(id));
    fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (argc < 2) {
    fprintf(stderr, "usage: ckpt_bench save-load|stall|writer --dir D [flags]\n");
    return 2;
  }
  auto args = ParseArgs(argc, argv);
  if (!args.count("dir")) {
    fprintf(stderr, "--dir is required\n");
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "save-load") return SaveLoad(args);
  if (mode == "stall") return Stall(args);
  if (mode == "writer") return Writer(args);
  fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
