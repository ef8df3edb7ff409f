// The job client's state machine, fast and deterministic: a fake ProcessLauncher (launcher.h keeps
// OS access behind that interface for this) records every start with its env and lets the test end
// a trainer; a fake server on loopback speaks the wire protocol (edl/proto/PROTOCOL.md) to the real
// Client; a ManualClock drives the grace periods and the channel timeout. The client runs on its
// io_context thread; the test thread plays the server and the trainers.
//
// "Nothing happened (yet)" is checked after a tick barrier: the client polls each trainer at the
// start of every tick, so two more polls of a trainer prove a whole tick ran after the test's last
// change (the clock advanced, a message was processed).
#include "jobclient/client.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "edl/net/auth.h"
#include "edl/net/framed_socket.h"
#include "edl/proto/frame.h"
#include "edl/runtime/env_contract.h"
#include "resnet50/backend.h"
#include "tests/testutil.h"

namespace edl::jobclient {
namespace {

using launcher::ExitInfo;
using launcher::TrainerSpec;
using nlohmann::json;
using std::chrono::milliseconds;
namespace env = launcher::env;

constexpr milliseconds kWait{30000};  // bound on every wait for the client (never reached)
constexpr char kSecret[] = "client-test-secret-0123456789abcdef";

// ---- the fake launcher

// One started trainer as the test sees it. Guarded by FakeLauncher::mu_.
struct FakeChild {
  std::string id;  // its EDL_TRAINER_ID
  TrainerSpec spec;
  int pid = 0;
  int polls = 0, terms = 0, kills = 0;
  bool ended = false;
  ExitInfo info;
};

class FakeLauncher : public launcher::ProcessLauncher {
 public:
  // Whether a SIGTERMed trainer ends at once (killed by SIGTERM) or ignores it.
  void set_exit_on_term(bool v) {
    std::lock_guard<std::mutex> lock(mu_);
    exit_on_term_ = v;
  }

  StatusOr<std::unique_ptr<launcher::TrainerProcess>> Start(const TrainerSpec& spec) override;

  // Waits until `pred(children)` holds (bounded).
  bool WaitFor(const std::function<bool(const std::vector<FakeChild>&)>& pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWait, [&] { return pred(Snapshot()); });
  }
  std::vector<FakeChild> children() {
    std::lock_guard<std::mutex> lock(mu_);
    return Snapshot();
  }
  FakeChild child(const std::string& id) {
    for (const FakeChild& c : children()) {
      if (c.id == id) return c;
    }
    ADD_FAILURE() << "no trainer " << id << " was started";
    return {};
  }
  bool WaitStarted(size_t n) {
    return WaitFor([&](const std::vector<FakeChild>& c) { return c.size() >= n; });
  }
  // The tick barrier (see the top of the file): waits for two more polls of trainer `id`.
  bool WaitTick(const std::string& id) {
    const int from = child(id).polls;
    return WaitFor([&](const std::vector<FakeChild>&) {
      const FakeChild* c = Find(id);
      return c == nullptr || c->polls >= from + 2;
    });
  }
  // Trainer `id` ends by itself.
  void End(const std::string& id, ExitInfo info) {
    std::lock_guard<std::mutex> lock(mu_);
    FakeChild* c = Find(id);
    ASSERT_NE(c, nullptr) << id;
    c->ended = true;
    c->info = info;
    cv_.notify_all();
  }

 private:
  friend class FakeProcess;
  std::vector<FakeChild> Snapshot() const {
    std::vector<FakeChild> out;
    for (const auto& c : children_) out.push_back(*c);
    return out;
  }
  FakeChild* Find(const std::string& id) {
    for (auto& c : children_) {
      if (c->id == id) return c.get();
    }
    return nullptr;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<FakeChild>> children_;
  bool exit_on_term_ = true;
};

class FakeProcess : public launcher::TrainerProcess {
 public:
  FakeProcess(FakeLauncher* l, FakeChild* c) : l_(l), c_(c) {}
  int pid() const override { return c_->pid; }  // set before the process is handed out
  bool Poll(ExitInfo* info) override {
    std::lock_guard<std::mutex> lock(l_->mu_);
    ++c_->polls;
    l_->cv_.notify_all();
    if (c_->ended) *info = c_->info;
    return c_->ended;
  }
  void Terminate() override {
    std::lock_guard<std::mutex> lock(l_->mu_);
    if (c_->ended) return;
    ++c_->terms;
    if (l_->exit_on_term_) EndBySignal(SIGTERM);
    l_->cv_.notify_all();
  }
  void Kill() override {
    std::lock_guard<std::mutex> lock(l_->mu_);
    if (c_->ended) return;
    ++c_->kills;
    EndBySignal(SIGKILL);
    l_->cv_.notify_all();
  }
  ExitInfo Stop(milliseconds) override {
    Terminate();
    Kill();
    std::lock_guard<std::mutex> lock(l_->mu_);
    return c_->info;
  }

 private:
  void EndBySignal(int sig) {
    c_->ended = true;
    c_->info = ExitInfo();
    c_->info.signal = sig;
  }
  FakeLauncher* const l_;
  FakeChild* const c_;  // owned by the launcher, which outlives the client's processes
};

StatusOr<std::unique_ptr<launcher::TrainerProcess>> FakeLauncher::Start(const TrainerSpec& spec) {
  std::lock_guard<std::mutex> lock(mu_);
  auto c = std::make_unique<FakeChild>();
  c->spec = spec;
  auto it = spec.env.find(env::kTrainerId);
  c->id = it == spec.env.end() ? "" : it->second;
  c->pid = 70000 + static_cast<int>(children_.size());
  auto proc = std::make_unique<FakeProcess>(this, c.get());
  children_.push_back(std::move(c));
  cv_.notify_all();
  return std::unique_ptr<launcher::TrainerProcess>(std::move(proc));
}

// ---- the fake server: one authenticated client connection on loopback

class FakeServer {
 public:
  FakeServer() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        ::listen(listen_fd_, 4) == 0 &&
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~FakeServer() { ::close(listen_fd_); }
  int port() const { return port_; }

  // Accepts the client and runs the handshake as the server does; the client's hello in *hello.
  Status Accept(proto::Hello* hello) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kWait.count())) != 1)
      return Status::Timeout("no client connected");
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return Status::IOError("accept failed");
    sock_ = std::make_unique<net::FramedSocket>(fd, "the client");
    proto::Challenge ch;
    ch.nonce = net::NewNonce();
    json j;
    ch.EncodeTo(&j);
    EDL_RETURN_IF_ERROR(sock_->Send(j, kWait));
    EDL_RETURN_IF_ERROR(sock_->Receive(&j, kWait));
    EDL_RETURN_IF_ERROR(hello->DecodeFrom(j));
    if (!net::MacEqual(hello->mac, net::HelloMac(kSecret, ch.nonce, j))) {
      return Status::Unauthenticated("the client's MAC is wrong");
    }
    proto::Welcome w;
    w.job_id = "job7";
    w.heartbeat_ms = 5000;  // the client's idle timeout on us: 10 heartbeats, longer than a test
    w.node_token = net::NewNonce();  // 64 hex, as the server hands out
    w.EncodeTo(&j);
    j["mac"] = net::WelcomeMac(kSecret, hello->nonce, j);
    EDL_RETURN_IF_ERROR(sock_->Send(j, kWait));
    // welcome and hello were the last unsealed frames (PROTOCOL.md "Sealed frames").
    sock_->StartSession(std::make_unique<net::SessionMac>(kSecret, ch.nonce, hello->nonce,
                                                          /*server_side=*/true));
    return Status::OK();
  }

  void Send(const json& j) { ASSERT_OK(sock_->Send(j, kWait)); }
  // Drops the client's connection, as a server that is killed does.
  void Close() { sock_.reset(); }

  // The next message of `type` from the client (others are kept for later calls).
  bool Next(const std::string& type, json* out) {
    for (auto it = backlog_.begin(); it != backlog_.end(); ++it) {
      if ((*it)["type"] == type) {
        *out = *it;
        backlog_.erase(it);
        return true;
      }
    }
    const auto end = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < end) {
      json m;
      if (!sock_->Receive(&m, milliseconds(200)).ok()) continue;
      if (m["type"] == type) {
        *out = m;
        return true;
      }
      if (m["type"] != proto::msg::kHeartbeat) backlog_.push_back(m);
    }
    return false;
  }

  // The next trainer_exit report, decoded.
  proto::TrainerExit NextExit() {
    json j;
    proto::TrainerExit e;
    EXPECT_TRUE(Next(proto::msg::kTrainerExit, &j)) << "no trainer_exit from the client";
    if (!j.is_null()) {
      EXPECT_OK(e.DecodeFrom(j));
    }
    return e;
  }

 private:
  int listen_fd_ = -1, port_ = 0;
  std::unique_ptr<net::FramedSocket> sock_;
  std::deque<json> backlog_;
};

proto::MemberInfo Member(const std::string& id, const std::string& node, int slot, int rank) {
  proto::MemberInfo m;
  m.trainer_id = id;
  m.node = node;
  m.slot = slot;
  m.rank = rank;
  m.host = "127.0.0.1";
  return m;
}

// ---- the fixture: a Client of node n1 (slots 0 and 1) on its own io thread

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.server_host = "127.0.0.1";
    options_.server_port = server_.port();
    options_.secret = kSecret;
    options_.node_name = "n1";
    options_.slots = {0, 1};
    options_.gpu_slots = true;
    options_.socket_path = dir_.Join("n1.sock");
    options_.log_dir = dir_.Join("logs");
    options_.stop_grace_ms = 5000;
    options_.leave_grace_ms = 30000;
    options_.trainer_timeout_ms = 20000;
    options_.trainer_argv = {"/opt/trainer", "--epochs", "3"};
    // These cases count the trainers the client starts; warm spares (real processes that wait on
    // the socket) are tested in tests/integration/spares_test.cc.
    options_.spares = 0;
    options_.tick_ms = 5;
  }

  // Starts the client with options_ (tests may change them first) and accepts it.
  void StartClient(bool restart_mode) {
    options_.restart_mode = restart_mode;
    auto l = std::make_unique<FakeLauncher>();
    launcher_ = l.get();
    client_ = std::make_unique<Client>(&io_, options_, std::move(l), &clock_);
    ASSERT_OK(client_->Start());
    io_thread_ = std::thread([this] { io_.run(); });
    ASSERT_OK(server_.Accept(&hello_));
  }

  void TearDown() override {
    if (!client_) return;
    if (io_thread_.joinable()) {
      launcher_->set_exit_on_term(true);
      boost::asio::post(io_, [this] { client_->Shutdown(0, "test over"); });
      io_thread_.join();
    }
    client_.reset();
  }

  void SendGeneration(int64_t n, std::vector<proto::MemberInfo> members,
                      const std::string& reason) {
    proto::GenerationInfo g;
    g.generation = n;
    g.job_id = "job7";
    g.reason = reason;
    g.failure = reason == "failure";
    g.members = std::move(members);
    g.master_addr = "127.0.0.1";
    g.master_port = 29500 + static_cast<int>(n);
    json j;
    proto::GenerationUpdate::Full(g).EncodeTo(&j);
    server_.Send(j);
  }

  // Connects to the client's socket as trainer `id` (trainer_hello, then the welcome).
  std::unique_ptr<net::FramedSocket> ConnectTrainer(const std::string& id) {
    auto s = net::FramedSocket::ConnectUnix(options_.socket_path, kWait);
    EXPECT_OK(s.status());
    if (!s.ok()) return nullptr;
    proto::TrainerHello h;
    h.trainer_id = id;
    json j;
    h.EncodeTo(&j);
    EXPECT_OK(s.value()->Send(j, kWait));
    EXPECT_OK(s.value()->Receive(&j, kWait));
    EXPECT_EQ(j["type"], proto::msg::kWelcome) << j.dump();
    return std::move(s.value());
  }

  // The next generation a trainer's channel receives, applied to *g.
  void NextGeneration(net::FramedSocket* trainer, proto::GenerationInfo* g) {
    json j;
    ASSERT_OK(trainer->Receive(&j, kWait));
    ASSERT_EQ(j["type"], proto::msg::kGeneration) << j.dump();
    proto::GenerationUpdate u;
    ASSERT_OK(u.DecodeFrom(j));
    ASSERT_OK(u.ApplyTo(g));
  }

  test::ScratchDir dir_{"edl-jobclient"};
  FakeServer server_;
  ManualClock clock_;
  boost::asio::io_context io_;  // destroyed after the client
  ClientOptions options_;
  FakeLauncher* launcher_ = nullptr;  // owned by the client
  std::unique_ptr<Client> client_;
  std::thread io_thread_;
  proto::Hello hello_;
};

std::string EnvOf(const FakeChild& c, const char* key) {
  auto it = c.spec.env.find(key);
  return it == c.spec.env.end() ? "<unset>" : it->second;
}

TEST_F(ClientTest, GenerationStartsThisNodesTrainersWithTheirEnv) {
  StartClient(false);
  EXPECT_EQ(hello_.node, "n1");
  EXPECT_EQ(hello_.mode, proto::NodeMode::kInplace);
  EXPECT_EQ(hello_.slots, (std::vector<int>{0, 1}));
  EXPECT_TRUE(hello_.trainers.empty());
  // Members in rank order; n2's trainer sits between n1's two.
  SendGeneration(
      1, {Member("n1-a", "n1", 1, 0), Member("n2-a", "n2", 0, 1), Member("n1-b", "n1", 0, 2)},
      "start");
  ASSERT_TRUE(launcher_->WaitStarted(2));
  // One pass over the members starts them in order: had n2-a been started, it would be second.
  const std::vector<FakeChild> started = launcher_->children();
  ASSERT_EQ(started[0].id, "n1-a");
  ASSERT_EQ(started[1].id, "n1-b");
  const struct {
    const char* id;
    const char* slot;
    const char* rank;
    const char* local_rank;
  } want[] = {{"n1-a", "1", "0", "0"}, {"n1-b", "0", "2", "1"}};
  for (const auto& w : want) {
    const FakeChild c = launcher_->child(w.id);
    SCOPED_TRACE(w.id);
    EXPECT_EQ(c.spec.argv, options_.trainer_argv);
    EXPECT_EQ(c.spec.log_path, options_.log_dir + "/" + w.id + ".log");
    EXPECT_EQ(EnvOf(c, env::kJobId), "job7");
    EXPECT_EQ(EnvOf(c, env::kClientSocket), options_.socket_path);
    EXPECT_EQ(EnvOf(c, env::kGeneration), "1");
    EXPECT_EQ(EnvOf(c, env::kSlot), w.slot);
    EXPECT_EQ(EnvOf(c, env::kCudaVisibleDevices), w.slot);
    EXPECT_EQ(EnvOf(c, env::kRank), w.rank);
    EXPECT_EQ(EnvOf(c, env::kWorldSize), "3");
    EXPECT_EQ(EnvOf(c, env::kLocalRank), w.local_rank);
    EXPECT_EQ(EnvOf(c, env::kLocalWorldSize), "2");
    EXPECT_EQ(EnvOf(c, env::kMasterAddr), "127.0.0.1");
    EXPECT_EQ(EnvOf(c, env::kMasterPort), "29501");
    EXPECT_EQ(EnvOf(c, env::kJoining), "<unset>");
  }
  // The trainer's channel gets the committed generation in full.
  auto t = ConnectTrainer("n1-b");
  ASSERT_NE(t, nullptr);
  proto::GenerationInfo g;
  NextGeneration(t.get(), &g);
  EXPECT_EQ(g.generation, 1);
  EXPECT_EQ(g.RankOf("n1-b"), 2);
}

TEST_F(ClientTest, ShrinkLetsTheLeaverExitThenStopsOnlyItAfterTheGraces) {
  options_.trainer_timeout_ms = 3600 * 1000;  // the survivor's channel stays quiet meanwhile
  StartClient(false);
  launcher_->set_exit_on_term(false);  // the leaver ignores SIGTERM: the client must SIGKILL it
  SendGeneration(1, {Member("n1-a", "n1", 0, 0), Member("n1-b", "n1", 1, 1)}, "start");
  ASSERT_TRUE(launcher_->WaitStarted(2));
  auto a = ConnectTrainer("n1-a");
  ASSERT_NE(a, nullptr);
  proto::GenerationInfo g;
  NextGeneration(a.get(), &g);
  SendGeneration(2, {Member("n1-a", "n1", 0, 0)}, "script");
  NextGeneration(a.get(), &g);  // the client has processed generation 2
  EXPECT_EQ(g.generation, 2);
  EXPECT_EQ(g.RankOf("n1-b"), -1);
  // In place, a leaver gets leave_grace to exit by itself: nothing is signalled yet.
  ASSERT_TRUE(launcher_->WaitTick("n1-b"));
  EXPECT_EQ(launcher_->child("n1-b").terms, 0);
  clock_.Advance(options_.leave_grace_ms * 1000 - 1000);
  ASSERT_TRUE(launcher_->WaitTick("n1-b"));
  EXPECT_EQ(launcher_->child("n1-b").terms, 0);
  // Past leave_grace: SIGTERM; past stop_grace after that: SIGKILL, reported as a kill.
  clock_.Advance(2000);
  ASSERT_TRUE(launcher_->WaitFor([](const std::vector<FakeChild>& c) { return c[1].terms == 1; }));
  clock_.Advance(options_.stop_grace_ms * 1000 - 1000);
  ASSERT_TRUE(launcher_->WaitTick("n1-b"));
  EXPECT_EQ(launcher_->child("n1-b").kills, 0);
  clock_.Advance(2000);
  ASSERT_TRUE(launcher_->WaitFor([](const std::vector<FakeChild>& c) { return c[1].kills == 1; }));
  const proto::TrainerExit e = server_.NextExit();
  EXPECT_EQ(e.trainer_id, "n1-b");
  EXPECT_FALSE(e.exited);
  EXPECT_EQ(e.signal, SIGKILL);
  // The survivor was never signalled.
  ASSERT_TRUE(launcher_->WaitTick("n1-a"));
  EXPECT_EQ(launcher_->child("n1-a").terms, 0);
  EXPECT_EQ(launcher_->child("n1-a").kills, 0);
  EXPECT_EQ(launcher_->children().size(), 2u);
}

TEST_F(ClientTest, TrainerExitIsReportedAndItsSlotReused) {
  StartClient(false);
  SendGeneration(1, {Member("n1-a", "n1", 0, 0), Member("n1-b", "n1", 1, 1)}, "start");
  ASSERT_TRUE(launcher_->WaitStarted(2));
  ExitInfo crashed;
  crashed.exited = true;
  crashed.code = 3;
  launcher_->End("n1-a", crashed);
  proto::TrainerExit e = server_.NextExit();
  EXPECT_EQ(e.trainer_id, "n1-a");
  EXPECT_TRUE(e.exited);
  EXPECT_EQ(e.code, 3);
  // The server grows back on the freed slot 0: a new trainer starts there at once.
  SendGeneration(2, {Member("n1-b", "n1", 1, 0)}, "failure");
  SendGeneration(3, {Member("n1-b", "n1", 1, 0), Member("n1-c", "n1", 0, 1)}, "grow_back");
  ASSERT_TRUE(launcher_->WaitStarted(3));
  const FakeChild c = launcher_->child("n1-c");
  EXPECT_EQ(EnvOf(c, env::kSlot), "0");
  EXPECT_EQ(EnvOf(c, env::kGeneration), "3");
  EXPECT_EQ(EnvOf(c, env::kRank), "1");
  // A trainer killed by a signal is reported as such.
  ExitInfo killed;
  killed.signal = SIGSEGV;
  launcher_->End("n1-b", killed);
  e = server_.NextExit();
  EXPECT_EQ(e.trainer_id, "n1-b");
  EXPECT_FALSE(e.exited);
  EXPECT_EQ(e.signal, SIGSEGV);
}

// A warm spare (docs/TRAINERS.md "Warm spares") on GPU slots: started once the node's trainers run,
// as a host spare that knows no GPU; the next trainer started here is the spare's process, told its
// identity, GPU included, over the spare's connection; no process is started for it.
TEST_F(ClientTest, TheNextTrainerIsTheWarmSpareWithItsGpu) {
  options_.spares = 1;
  StartClient(false);
  SendGeneration(1, {Member("n1-a", "n1", 0, 0)}, "start");
  ASSERT_TRUE(launcher_->WaitStarted(1));
  auto a = ConnectTrainer("n1-a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(launcher_->WaitStarted(2));  // the spare, now that n1-a runs
  const FakeChild spare = launcher_->children()[1];
  EXPECT_EQ(spare.id, "n1-spare-1");
  EXPECT_EQ(spare.spec.argv, options_.trainer_argv);
  EXPECT_EQ(spare.spec.log_path, options_.log_dir + "/n1-spare-1.log");
  EXPECT_EQ(EnvOf(spare, env::kSpare), "host");  // GPU slots: the GPU is named by the assignment
  EXPECT_EQ(EnvOf(spare, env::kCudaVisibleDevices), "<unset>");
  EXPECT_EQ(EnvOf(spare, env::kWorldSize), "1");  // the job's largest world so far
  EXPECT_EQ(EnvOf(spare, env::kJoining), "<unset>");
  // The spare is prepared: spare_hello, welcomed.
  auto s = net::FramedSocket::ConnectUnix(options_.socket_path, kWait);
  ASSERT_OK(s.status());
  proto::SpareHello h;
  h.spare_id = "n1-spare-1";
  ASSERT_OK(s.value()->Send(h.Encoded(), kWait));
  json j;
  ASSERT_OK(s.value()->Receive(&j, kWait));
  ASSERT_EQ(j["type"], proto::msg::kWelcome) << j.dump();
  // A second trainer for this node: the spare becomes it.
  SendGeneration(2, {Member("n1-a", "n1", 0, 0), Member("n1-b", "n1", 1, 1)}, "script");
  ASSERT_OK(s.value()->Receive(&j, kWait));
  proto::SpareAssign assign;
  ASSERT_TRUE(assign.DecodeFrom(j).ok()) << j.dump();
  EXPECT_EQ(assign.env[env::kTrainerId], "n1-b");
  EXPECT_EQ(assign.env[env::kCudaVisibleDevices], "1");
  EXPECT_EQ(assign.env[env::kSlot], "1");
  EXPECT_EQ(assign.env[env::kRank], "1");
  EXPECT_EQ(assign.env[env::kWorldSize], "2");
  EXPECT_EQ(assign.env.count(env::kSpare), 0u);
  EXPECT_FALSE(s.value()->Receive(&j, kWait).ok()) << "the client closes the spare's connection";
  // It connects again as n1-b, the trainer the client now runs in the spare's process.
  auto b = ConnectTrainer("n1-b");
  ASSERT_NE(b, nullptr);
  // (The client may already be warming the next spare: only a process of n1-b's own is wrong.)
  for (const FakeChild& c : launcher_->children())
    EXPECT_NE(c.id, "n1-b") << "a process was started for n1-b";
  // Its exit is n1-b's.
  ExitInfo done;
  done.exited = true;
  launcher_->End("n1-spare-1", done);
  const proto::TrainerExit e = server_.NextExit();
  EXPECT_EQ(e.trainer_id, "n1-b");
}

// On a node whose trainers each see every GPU (`edl client --slots`, no --gpus), the device a
// trainer opens by default is its slot's (EnvContract::DeviceHint, then ResolveCudaDevice's
// modulo): first-generation members whose local ranks differ from their slots, a prepared joiner
// (LOCAL_RANK 0) and a warm spare assigned to a slot each land on that slot's GPU, never on GPU 0
// by default. The stand-in trainers report the device from the env the client gave them.
TEST_F(ClientTest, EveryTrainerOpensItsSlotsGpuUnderCpuSlots) {
  options_.slots = {0, 1, 2, 3};
  options_.gpu_slots = false;
  options_.spares = 1;
  StartClient(false);
  constexpr int kVisibleGpus = 8;
  auto device_of = [](const std::map<std::string, std::string>& env) {  // what the trainer opens
    auto c = runtime::ParseTrainerEnv(env);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return -1;
    auto d = resnet50::ResolveCudaDevice(resnet50::kAutoCudaDevice, c.value().DeviceHint(),
                                         kVisibleGpus);
    return d.ok() ? d.value() : -1;
  };
  SendGeneration(1, {Member("n1-a", "n1", 3, 0), Member("n1-b", "n1", 1, 1)}, "start");
  ASSERT_TRUE(launcher_->WaitStarted(2));
  EXPECT_EQ(EnvOf(launcher_->child("n1-a"), env::kLocalRank), "0");
  EXPECT_EQ(device_of(launcher_->child("n1-a").spec.env), 3);
  EXPECT_EQ(EnvOf(launcher_->child("n1-b"), env::kLocalRank), "1");
  EXPECT_EQ(device_of(launcher_->child("n1-b").spec.env), 1);
  auto a = ConnectTrainer("n1-a");
  auto b = ConnectTrainer("n1-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(launcher_->WaitStarted(3));  // the spare
  const FakeChild spare = launcher_->children()[2];
  ASSERT_EQ(spare.id, "n1-spare-1");
  EXPECT_EQ(EnvOf(spare, env::kSpare), "full");  // CPU slots: it may prepare its model (on the CPU)
  // A joiner prepared on slot 2.
  proto::Prepare p;
  p.generation = 2;
  p.job_id = "job7";
  p.world_size = 3;
  p.joiners = {Member("n1-j", "n1", 2, 2)};
  json j;
  p.EncodeTo(&j);
  auto s = net::FramedSocket::ConnectUnix(options_.socket_path, kWait);  // the spare waits first
  ASSERT_OK(s.status());
  proto::SpareHello h;
  h.spare_id = "n1-spare-1";
  ASSERT_OK(s.value()->Send(h.Encoded(), kWait));
  ASSERT_OK(s.value()->Receive(&j, kWait));
  ASSERT_EQ(proto::TypeOf(j), proto::msg::kWelcome) << j.dump();
  p.EncodeTo(&j);
  server_.Send(j);
  // The joiner is the spare: its assignment names slot 2 and LOCAL_RANK 0.
  ASSERT_OK(s.value()->Receive(&j, kWait));
  proto::SpareAssign assign;
  ASSERT_TRUE(assign.DecodeFrom(j).ok()) << j.dump();
  EXPECT_EQ(assign.env[env::kTrainerId], "n1-j");
  EXPECT_EQ(assign.env[env::kLocalRank], "0");
  EXPECT_EQ(assign.env.count(env::kCudaVisibleDevices), 0u);
  EXPECT_EQ(device_of(std::map<std::string, std::string>(assign.env.begin(), assign.env.end())), 2);
  // A second joiner, started cold (no spare is prepared yet), on slot 0.
  p.generation = 3;
  p.world_size = 4;
  p.joiners = {Member("n1-k", "n1", 0, 3)};
  p.EncodeTo(&j);
  server_.Send(j);
  ASSERT_TRUE(launcher_->WaitFor([](const std::vector<FakeChild>& c) {
    for (const FakeChild& x : c) {
      if (x.id == "n1-k") return true;
    }
    return false;
  }));
  EXPECT_EQ(EnvOf(launcher_->child("n1-k"), env::kLocalRank), "0");
  EXPECT_EQ(device_of(launcher_->child("n1-k").spec.env), 0);
}

TEST_F(ClientTest, SilentTrainerIsKilledAfterTheChannelTimeout) {
  StartClient(false);
  SendGeneration(1, {Member("n1-a", "n1", 0, 0)}, "start");
  ASSERT_TRUE(launcher_->WaitStarted(1));
  auto t = ConnectTrainer("n1-a");
  ASSERT_NE(t, nullptr);
  const int64_t timeout_us = options_.trainer_timeout_ms * 1000;
  clock_.Advance(timeout_us - 1000);
  ASSERT_TRUE(launcher_->WaitTick("n1-a"));
  EXPECT_EQ(launcher_->child("n1-a").kills, 0);
  // A heartbeat restarts the timeout; a ready report behind it shows the client has read it.
  ASSERT_OK(t->Send(json{{"type", proto::msg::kHeartbeat}}, kWait));
  proto::Ready r;
  r.generation = 1;
  json j;
  r.EncodeTo(&j);
  ASSERT_OK(t->Send(j, kWait));
  ASSERT_TRUE(server_.Next(proto::msg::kReady, &j));
  EXPECT_EQ(j["trainer_id"], "n1-a") << j.dump();
  clock_.Advance(timeout_us - 1000);
  ASSERT_TRUE(launcher_->WaitTick("n1-a"));
  EXPECT_EQ(launcher_->child("n1-a").kills, 0) << "killed although it spoke within the timeout";
  // Silent past the timeout: SIGKILL, reported.
  clock_.Advance(2000);
  ASSERT_TRUE(launcher_->WaitFor([](const std::vector<FakeChild>& c) { return c[0].kills == 1; }));
  const proto::TrainerExit e = server_.NextExit();
  EXPECT_EQ(e.trainer_id, "n1-a");
  EXPECT_EQ(e.signal, SIGKILL);
}

TEST_F(ClientTest, RestartModeStopsEveryTrainerAndStartsTheNewOnesOnceTheirSlotsAreFree) {
  StartClient(true);
  EXPECT_EQ(hello_.mode, proto::NodeMode::kRestart);
  launcher_->set_exit_on_term(false);  // the test decides when each old trainer has exited
  SendGeneration(1, {Member("n1-a", "n1", 0, 0), Member("n1-b", "n1", 1, 1)}, "start");
  ASSERT_TRUE(launcher_->WaitStarted(2));
  // Generation 2 keeps one trainer's worth on this node (slot 0, new id) and one on n2: in
  // restart mode both old trainers are stopped, and the new one waits for slot 0.
  SendGeneration(2, {Member("n1-c", "n1", 0, 0), Member("n2-a", "n2", 0, 1)}, "script");
  ASSERT_TRUE(launcher_->WaitFor(
      [](const std::vector<FakeChild>& c) { return c[0].terms == 1 && c[1].terms == 1; }));
  ExitInfo clean;
  clean.exited = true;
  launcher_->End("n1-b", clean);  // slot 1 frees; slot 0 is still busy
  EXPECT_EQ(server_.NextExit().trainer_id, "n1-b");
  ASSERT_TRUE(launcher_->WaitTick("n1-a"));
  EXPECT_EQ(launcher_->children().size(), 2u) << "n1-c started while slot 0 was busy";
  launcher_->End("n1-a", clean);
  EXPECT_EQ(server_.NextExit().trainer_id, "n1-a");
  ASSERT_TRUE(launcher_->WaitStarted(3));
  const FakeChild c = launcher_->child("n1-c");
  EXPECT_EQ(EnvOf(c, env::kGeneration), "2");
  EXPECT_EQ(EnvOf(c, env::kSlot), "0");
  EXPECT_EQ(EnvOf(c, env::kRank), "0");
  EXPECT_EQ(EnvOf(c, env::kWorldSize), "2");
  EXPECT_EQ(EnvOf(c, env::kLocalWorldSize), "1");
  EXPECT_EQ(EnvOf(c, env::kMasterPort), "29502");
  EXPECT_EQ(EnvOf(c, env::kJoining), "<unset>");
}

// A trainer's KV wait that the client forwarded to the server when the server goes away: the
// client answers it Unavailable at once (the rendezvous retries through the restart), rather than
// leaving the trainer to sit out the wait plus its margin for a reply that will never come. The
// wait asks for an hour, so only the client's answer can end it within the test.
TEST_F(ClientTest, KvWaitInFlightWhenTheServerGoesAwayIsAnsweredUnavailable) {
  StartClient(false);
  SendGeneration(1, {Member("t1", "n1", 0, 0)}, "start");
  ASSERT_TRUE(launcher_->WaitStarted(1));
  auto trainer = ConnectTrainer("t1");
  ASSERT_NE(trainer, nullptr);
  proto::KvRequest r;
  r.req_id = 42;
  r.op = proto::KvOp::kWait;
  r.key = "gen/1/gloo/0";
  r.timeout_ms = 3'600'000;
  ASSERT_OK(trainer->Send(r.Encoded(), kWait));
  json forwarded;
  ASSERT_TRUE(server_.Next(proto::msg::kKv, &forwarded)) << "the client did not forward the wait";
  server_.Close();
  for (;;) {  // generations may come first
    json j;
    ASSERT_OK(trainer->Receive(&j, kWait));
    if (j["type"] != proto::msg::kKvReply) continue;
    proto::KvReply rep;
    ASSERT_OK(rep.DecodeFrom(j));
    EXPECT_EQ(rep.req_id, 42u);  // the trainer's own id
    EXPECT_EQ(rep.status.code(), Status::Code::kUnavailable) << rep.status.ToString();
    EXPECT_NE(rep.status.message().find("lost its server connection"), std::string::npos)
        << rep.status.ToString();
    break;
  }
}

TEST_F(ClientTest, PreparedJoinerStartsJoiningAndIsKilledWhenTheCommitLeavesItOut) {
  StartClient(false);
  SendGeneration(1, {Member("n1-a", "n1", 0, 0), Member("n2-a", "n2", 0, 1)}, "start");
  ASSERT_TRUE(launcher_->WaitStarted(1));
  proto::Prepare p;
  p.generation = 2;
  p.job_id = "job7";
  p.world_size = 4;
  p.master_addr = "127.0.0.1";
  p.master_port = 29502;
  p.joiners = {Member("n1-j", "n1", 1, 2), Member("n1-x", "n1", 7, 3)};  // slot 7 is not ours
  json j;
  p.EncodeTo(&j);
  server_.Send(j);
  ASSERT_TRUE(launcher_->WaitStarted(2));
  const FakeChild c = launcher_->child("n1-j");
  EXPECT_EQ(EnvOf(c, env::kJoining), "1");
  EXPECT_EQ(EnvOf(c, env::kGeneration), "2");
  EXPECT_EQ(EnvOf(c, env::kRank), "2");
  EXPECT_EQ(EnvOf(c, env::kWorldSize), "4");
  EXPECT_EQ(EnvOf(c, env::kSlot), "1");
  // The commit leaves the joiner out (it was not ready in time): the client kills it.
  SendGeneration(2, {Member("n1-a", "n1", 0, 0), Member("n2-a", "n2", 0, 1)}, "join_timeout");
  ASSERT_TRUE(launcher_->WaitFor([](const std::vector<FakeChild>& c) { return c[1].kills == 1; }));
  EXPECT_EQ(server_.NextExit().trainer_id, "n1-j");
  EXPECT_EQ(launcher_->children().size(), 2u) << "a joiner on a slot not offered was started";
  EXPECT_EQ(launcher_->child("n1-a").terms + launcher_->child("n1-a").kills, 0);
}

}  // namespace
}  // namespace edl::jobclient
