// Distillation with elastic teacher services, end to end with real processes
// (docs/DISTILLATION.md): a real `edl server`, `edl teacher`s registered with it under service "kd"
// (serving a ResNet-20 checkpoint trained by `edl train` at the start of the test) and one `edl
// client` whose 2 slots run distilling `edl train` students on a 1024-sample Fashion-MNIST subset.
// During training a teacher is SIGKILLed and another one added, and the students re-form (2 -> 1 ->
// 2). The students finish; every sample each student trained had a teacher answer or was counted as
// a fallback; the students' states are identical after every re-form. Bad input: a teacher whose
// checkpoint does not match the dataset's classes, a student naming an unknown service: clear
// errors, exit codes, no crash.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "edl/ckpt/checkpoint_store.h"
#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

using itest::Proc;
using itest::ReadLines;
using itest::Slurp;
using itest::WaitFor;
using nlohmann::json;
using std::chrono::milliseconds;

constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";
constexpr const char* kSamples = "1024";

class DistillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kFashionDir) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST not installed at " << kFashionDir;
    }
    secret_ = dir_.Join("secret");
    itest::WriteSecretFile(secret_, "distill-integration-secret-0123456789");
  }

  // A few steps of ResNet-20 saved to `ckpt`: a teacher (quality does not matter here).
  void TrainTeacherCheckpoint() {
    const int rc =
        itest::RunCommand({test::EdlBinary(), "train", "--model", "resnet20", "--train_samples",
                           kSamples, "--batch_size", "16", "--max_steps", "3", "--threads", "1",
                           "--eval", "false", "--checkpoint_dir", dir_.Join("ckpt")},
                          dir_.Join("teacher-train.log"), milliseconds(300000));
    ASSERT_EQ(rc, 0) << Slurp(dir_.Join("teacher-train.log"), 4000);
  }

  void StartServer() {
    server_ = std::make_unique<Proc>(std::vector<std::string>{test::EdlBinary(),
                                                              "server",
                                                              "--server_port",
                                                              "0",
                                                              "--bind",
                                                              "127.0.0.1",
                                                              "--port_file",
                                                              dir_.Join("port"),
                                                              "--secret_file",
                                                              secret_,
                                                              "--job_id",
                                                              "dtest",
                                                              "--min_trainers",
                                                              "1",
                                                              "--trainers",
                                                              "2",
                                                              "--events_dir",
                                                              dir_.Join("events"),
                                                              "--join_timeout_s",
                                                              "60",
                                                              "--heartbeat_timeout_ms",
                                                              "3000"},
                                     dir_.Join("server.log"));
    port_ = itest::WaitForPortFile(dir_.Join("port"), server_.get());
    ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  }

  std::unique_ptr<Proc> StartTeacher(const std::string& name, const std::string& ckpt) {
    return std::make_unique<Proc>(
        std::vector<std::string>{test::EdlBinary(),  "teacher",
                                 "--service",        "kd",
                                 "--name",           name,
                                 "--model",          "resnet20",
                                 "--train_samples",  kSamples,
                                 "--checkpoint_dir", ckpt,
                                 "--server",         "127.0.0.1:" + port_,
                                 "--secret_file",    secret_,
                                 "--bind",           "127.0.0.1",
                                 "--threads",        "1",
                                 "--port_file",      dir_.Join(name + ".port"),
                                 "--log_every_s",    "1"},
        dir_.Join(name + ".log"));
  }

  // Service "kd" as the server lists it (`edl ctl status --json`); empty when not reachable.
  json KdStatus() {
    const std::string log = dir_.Join("status.json");
    std::filesystem::remove(log);
    if (itest::RunCommand({test::EdlBinary(), "ctl", "--server", "127.0.0.1:" + port_,
                           "--secret_file", secret_, "status", "--json"},
                          log, milliseconds(30000)) != 0) {
      return json::object();
    }
    // The JSON body, whatever log lines surround it.
    const std::string text = Slurp(log);
    const size_t begin = text.find('{'), end = text.rfind('}');
    if (begin == std::string::npos || end == std::string::npos || end < begin)
      return json::object();
    try {
      return json::parse(text.substr(begin, end - begin + 1))
          .value("services", json::object())
          .value("kd", json::object());
    } catch (const std::exception&) {
      return json::object();
    }
  }
  // Teachers of "kd" the server lists.
  std::set<std::string> ListedTeachers() {
    std::set<std::string> out;
    for (const json& t : KdStatus().value("teachers", json::array()))
      out.insert(t.value("name", std::string()));
    return out;
  }

  int Ctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {test::EdlBinary(),    "ctl",           "--server",
                                     "127.0.0.1:" + port_, "--secret_file", secret_};
    argv.insert(argv.end(), args.begin(), args.end());
    return itest::RunCommand(argv, dir_.Join("ctl.log"), milliseconds(60000));
  }

  std::vector<json> Events() { return ReadLines(dir_.Join("events/dtest.events.jsonl")); }
  std::vector<json> Typed(const std::string& type, const std::string& event = "") {
    std::vector<json> out;
    for (const json& e : Events()) {
      if (e.value("type", "") == type && (event.empty() || e.value("event", "") == event))
        out.push_back(e);
    }
    return out;
  }
  int64_t MaxStep() {
    int64_t max = 0;
    for (const json& l : ReadLines(dir_.Join("samples.jsonl")))
      max = std::max(max, l.value("step", int64_t{0}));
    return max;
  }
  bool Finished() { return !Typed("finished").empty(); }
  bool WaitForMoreSteps(int64_t n) {
    const int64_t from = MaxStep();
    return WaitFor([&] { return MaxStep() >= from + n || Finished(); }, milliseconds(180000)) &&
           !Finished();
  }
  // A generation of `world` members newer than `after` in which every member synced; 0: none.
  int64_t WaitForFormed(int world, int64_t after) {
    int64_t formed = 0;
    WaitFor(
        [&] {
          for (const json& g : Typed("generation")) {
            const int64_t n = g["generation"].get<int64_t>();
            if (n <= after || g["world_size_after"] != world) continue;
            int synced = 0;
            for (const json& e : Typed("trainer_event", "sync")) synced += e["generation"] == n;
            if (synced >= world) formed = n;
          }
          return formed > 0;
        },
        milliseconds(180000));
    return formed;
  }
  std::string Diagnostics() {
    std::string logs;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(dir_.Join("logs"), ec)) {
      logs += "\n--- " + f.path().filename().string() + "\n" + Slurp(f.path().string(), 3000);
    }
    for (const char* t : {"t1", "t2", "t3"})
      logs += "\n--- " + std::string(t) + "\n" + Slurp(dir_.Join(std::string(t) + ".log"), 2000);
    return "\n--- server\n" + Slurp(dir_.Join("server.log"), 6000) + logs;
  }

  test::ScratchDir dir_{"edl-distill"};
  std::string secret_, port_;
  std::unique_ptr<Proc> server_;
};

TEST_F(DistillTest, TeachersComeAndGoWhileStudentsTrainAndReform) {
  TrainTeacherCheckpoint();
  if (HasFatalFailure()) return;
  StartServer();
  if (HasFatalFailure()) return;
  auto t1 = StartTeacher("t1", dir_.Join("ckpt"));
  auto t2 = StartTeacher("t2", dir_.Join("ckpt"));
  ASSERT_TRUE(WaitFor(
      [&] {
        return ListedTeachers() == std::set<std::string>{"t1", "t2"};
      },
      milliseconds(120000)))
      << Diagnostics();
  auto client = std::make_unique<Proc>(std::vector<std::string>{test::EdlBinary(),
                                                                "client",
                                                                "--server",
                                                                "127.0.0.1:" + port_,
                                                                "--secret_file",
                                                                secret_,
                                                                "--node_name",
                                                                "n1",
                                                                "--slots",
                                                                "2",
                                                                "--mode",
                                                                "inplace",
                                                                "--socket_path",
                                                                dir_.Join("n1.sock"),
                                                                "--log_dir",
                                                                dir_.Join("logs"),
                                                                "--leave_grace_s",
                                                                "30",
                                                                "--stop_grace_s",
                                                                "2",
                                                                "--trainer_timeout_s",
                                                                "30",
                                                                "--",
                                                                test::EdlBinary(),
                                                                "train",
                                                                "--model",
                                                                "resnet20",
                                                                "--train_samples",
                                                                kSamples,
                                                                "--batch_size",
                                                                "16",
                                                                "--lr",
                                                                "0.05",
                                                                "--lr_decay",
                                                                "constant",
                                                                "--epochs",
                                                                "3",
                                                                "--threads",
                                                                "1",
                                                                "--log_every",
                                                                "10",
                                                                "--eval",
                                                                "false",
                                                                "--comm_timeout_s",
                                                                "20",
                                                                "--sample_log",
                                                                dir_.Join("samples.jsonl"),
                                                                "--distill",
                                                                "kd",
                                                                "--distill_server",
                                                                "127.0.0.1:" + port_,
                                                                "--secret_file",
                                                                secret_,
                                                                "--distill_temperature",
                                                                "4",
                                                                "--distill_alpha",
                                                                "0.5",
                                                                "--distill_wait_s",
                                                                "10",
                                                                "--distill_resend_s",
                                                                "3"},
                                       dir_.Join("client.log"));
  const int64_t g1 = WaitForFormed(2, 0);
  ASSERT_GT(g1, 0) << Diagnostics();
  ASSERT_TRUE(WaitForMoreSteps(5)) << Diagnostics();
  // A teacher dies mid-epoch; another one joins the service.
  t1->Kill(SIGKILL);
  auto t3 = StartTeacher("t3", dir_.Join("ckpt"));
  ASSERT_TRUE(WaitFor(
      [&] {
        return ListedTeachers() == std::set<std::string>{"t2", "t3"};
      },
      milliseconds(120000)))
      << Diagnostics();
  ASSERT_TRUE(WaitForMoreSteps(5)) << Diagnostics();
  // The students re-form on their own schedule: 2 -> 1 -> 2.
  ASSERT_EQ(Ctl({"scale", "1"}), 0) << Slurp(dir_.Join("ctl.log"));
  const int64_t g2 = WaitForFormed(1, g1);
  ASSERT_GT(g2, 0) << Diagnostics();
  ASSERT_TRUE(WaitForMoreSteps(3)) << Diagnostics();
  ASSERT_EQ(Ctl({"scale", "2"}), 0) << Slurp(dir_.Join("ctl.log"));
  ASSERT_GT(WaitForFormed(2, g2), 0) << Diagnostics();
  ASSERT_TRUE(WaitFor([&] { return Finished(); }, milliseconds(400000))) << Diagnostics();

  // Identical student states after every re-form.
  std::map<int64_t, std::set<std::string>> hashes;
  for (const json& e : Typed("trainer_event", "sync")) {
    hashes[e["generation"].get<int64_t>()].insert(e["state_hash"].get<std::string>());
  }
  ASSERT_GE(hashes.size(), 3u) << Diagnostics();
  for (auto& [g, h] : hashes) EXPECT_EQ(h.size(), 1u) << "generation " << g << Diagnostics();

  // Every sample a student trained got a teacher answer or was counted as a fallback: each
  // student's "distill answered=A fallback=F" equals the samples it fed (its sample-log lines).
  std::map<std::string, int64_t> fed;
  for (const json& l : ReadLines(dir_.Join("samples.jsonl"))) {
    if (l.contains("fed_idx")) fed[l["trainer"].get<std::string>()] += l["fed_idx"].size();
  }
  int64_t answered = 0, students = 0;
  const std::regex id_re("mode, trainer (\\S+)"),
      counts_re("distill answered=(\\d+) fallback=(\\d+)");
  std::error_code ec;
  // Each student prints its counts as it exits, just after the job is marked finished.
  EXPECT_TRUE(WaitFor(
      [&] {
        for (const auto& f : std::filesystem::directory_iterator(dir_.Join("logs"), ec)) {
          const std::string log = Slurp(f.path().string());
          if (std::regex_search(log, id_re) && !std::regex_search(log, counts_re)) return false;
        }
        return true;
      },
      milliseconds(60000)))
      << Diagnostics();
  for (const auto& f : std::filesystem::directory_iterator(dir_.Join("logs"), ec)) {
    const std::string log = Slurp(f.path().string());
    std::smatch id, counts;
    if (!std::regex_search(log, id, id_re) || !std::regex_search(log, counts, counts_re)) continue;
    const int64_t a = std::stoll(counts[1]), fb = std::stoll(counts[2]);
    EXPECT_EQ(a + fb, fed[id[1]]) << id[1] << Diagnostics();
    std::cout << "student " << id[1] << ": " << a << " samples answered, " << fb
              << " fell back to labels\n";
    answered += a;
    ++students;
  }
  EXPECT_GE(students, 2) << Diagnostics();
  EXPECT_GT(answered, 0) << "no teacher ever answered" << Diagnostics();
  client->Stop();
}

// The pids of the `edl teacher` processes of this test (its secret file is in their command
// line), by --name.
std::map<std::string, int> TeacherPids(const std::string& secret) {
  std::map<std::string, int> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::vector<std::string> args;
    std::ifstream in(e.path() / "cmdline");
    for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
    if (args.size() < 2 || args[1] != "teacher" ||
        std::find(args.begin(), args.end(), secret) == args.end())
      continue;
    const auto name = std::find(args.begin(), args.end(), "--name");
    if (name != args.end() && name + 1 != args.end()) out[*(name + 1)] = std::stoi(pid);
  }
  return out;
}

// Teachers as elastic services run by the clients (docs/DISTILLATION.md): the client offers
// service kd (`--service kd = edl teacher ...`, the command stays on the node), `edl ctl scale kd
// N` makes the server place N teachers there, 1 -> 2 -> 1, while a student trains through them; a
// SIGKILLed teacher is replaced, answers keep coming, a SIGKILLed client's teachers stop and are
// placed elsewhere, and a client's exit stops its teachers.
// The student has no server address (no --distill_server): its client relays the teacher lists,
// so every teacher it reaches it learned from a push.
TEST_F(DistillTest, CtlScaleRunsTeachersOnTheClientsAndReplacesAKilledOne) {
  TrainTeacherCheckpoint();
  if (HasFatalFailure()) return;
  server_ = std::make_unique<Proc>(std::vector<std::string>{test::EdlBinary(),
                                                            "server",
                                                            "--server_port",
                                                            "0",
                                                            "--bind",
                                                            "127.0.0.1",
                                                            "--port_file",
                                                            dir_.Join("port"),
                                                            "--secret_file",
                                                            secret_,
                                                            "--job_id",
                                                            "dtest",
                                                            "--min_trainers",
                                                            "1",
                                                            "--trainers",
                                                            "1",
                                                            "--events_dir",
                                                            dir_.Join("events"),
                                                            "--heartbeat_timeout_ms",
                                                            "3000"},
                                   dir_.Join("server.log"));
  port_ = itest::WaitForPortFile(dir_.Join("port"), server_.get());
  ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  const std::string teacher_cmd =
      "kd = " + test::EdlBinary() + " teacher --model resnet20 --train_samples " + kSamples +
      " --checkpoint_dir " + dir_.Join("ckpt") + " --bind 127.0.0.1 --threads 1 --log_every_s 1";
  auto client = std::make_unique<Proc>(std::vector<std::string>{test::EdlBinary(),
                                                                "client",
                                                                "--server",
                                                                "127.0.0.1:" + port_,
                                                                "--secret_file",
                                                                secret_,
                                                                "--node_name",
                                                                "n1",
                                                                "--slots",
                                                                "1",
                                                                "--socket_path",
                                                                dir_.Join("n1.sock"),
                                                                "--log_dir",
                                                                dir_.Join("logs"),
                                                                "--stop_grace_s",
                                                                "5",
                                                                "--service",
                                                                teacher_cmd,
                                                                "--teacher_slots",
                                                                "2",
                                                                "--",
                                                                test::EdlBinary(),
                                                                "train",
                                                                "--model",
                                                                "resnet20",
                                                                "--train_samples",
                                                                kSamples,
                                                                "--batch_size",
                                                                "16",
                                                                "--epochs",
                                                                "50",
                                                                "--threads",
                                                                "1",
                                                                "--log_every",
                                                                "10",
                                                                "--eval",
                                                                "false",
                                                                "--sample_log",
                                                                dir_.Join("samples.jsonl"),
                                                                "--distill",
                                                                "kd",
                                                                "--secret_file",
                                                                secret_,
                                                                "--distill_wait_s",
                                                                "5",
                                                                "--distill_resend_s",
                                                                "2",
                                                                "--distill_discovery_s",
                                                                "300"},
                                       dir_.Join("client.log"));
  // Refused until a client offering kd is connected; then one teacher, n1-t1.
  ASSERT_TRUE(WaitFor(
      [&] {
        return Ctl({"scale", "--service", "kd", "1"}) == 0;
      },
      milliseconds(60000)))
      << Slurp(dir_.Join("ctl.log")) << Diagnostics();
  ASSERT_TRUE(WaitFor([&] { return ListedTeachers() == std::set<std::string>{"n1-t1"}; },
                      milliseconds(120000)))
      << Diagnostics();
  ASSERT_TRUE(WaitForMoreSteps(3)) << Diagnostics();
  ASSERT_EQ(Ctl({"scale", "--service", "kd", "2"}), 0) << Slurp(dir_.Join("ctl.log"));
  ASSERT_TRUE(WaitFor(
      [&] {
        return ListedTeachers() == std::set<std::string>{"n1-t1", "n1-t2"};
      },
      milliseconds(120000)))
      << Diagnostics();
  EXPECT_EQ(TeacherPids(secret_).size(), 2u);

  // A teacher dies: the server has the client start a replacement; the student keeps training
  // and the teachers keep answering.
  const int killed = TeacherPids(secret_).at("n1-t1");
  ASSERT_EQ(::kill(killed, SIGKILL), 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        return ListedTeachers() == std::set<std::string>{"n1-t2", "n1-t3"};
      },
      milliseconds(120000)))
      << Diagnostics();
  ASSERT_TRUE(WaitForMoreSteps(3)) << Diagnostics();
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const json& t : KdStatus().value("teachers", json::array())) {
          if (t.value("requests_per_sec", 0.0) > 0) return true;
        }
        return false;
      },
      milliseconds(60000)))
      << "no teacher answered after the replacement" << Diagnostics();

  // Back to 1: the newest is stopped, its process exits.
  ASSERT_EQ(Ctl({"scale", "--service", "kd", "1"}), 0) << Slurp(dir_.Join("ctl.log"));
  ASSERT_TRUE(WaitFor(
      [&] {
        return ListedTeachers() == std::set<std::string>{"n1-t2"} &&
               TeacherPids(secret_).size() == 1;
      },
      milliseconds(60000)))
      << Diagnostics();
  ASSERT_TRUE(WaitForMoreSteps(2)) << Diagnostics();
  const json kd = KdStatus();
  EXPECT_EQ(kd.value("desired", -1), 1) << kd.dump();
  EXPECT_EQ(kd.value("restarts", -1), 1) << kd.dump();
  ASSERT_EQ(Ctl({"status"}), 0);
  EXPECT_NE(Slurp(dir_.Join("ctl.log")).find("service kd: desired 1, placed 1 (n1-t2), replaced 1"),
            std::string::npos)
      << Slurp(dir_.Join("ctl.log"));
  // A client killed outright leaves no teacher behind (its teachers stop once their parent is
  // gone), and the server places the lost teacher elsewhere.
  auto client2 = std::make_unique<Proc>(
      std::vector<std::string>{
          test::EdlBinary(), "client", "--server", "127.0.0.1:" + port_, "--secret_file", secret_,
          "--node_name", "n2", "--slots", "1", "--socket_path", dir_.Join("n2.sock"), "--log_dir",
          dir_.Join("logs2"), "--service", teacher_cmd, "--", "/bin/sleep", "600"},
      dir_.Join("client2.log"));
  ASSERT_TRUE(WaitFor([&] { return KdStatus().value("nodes", json::array()).size() == 2; },
                      milliseconds(60000)))
      << Slurp(dir_.Join("client2.log"));
  ASSERT_EQ(Ctl({"scale", "--service", "kd", "2"}), 0) << Slurp(dir_.Join("ctl.log"));
  auto on_n2 = [&] {
    for (const auto& [name, pid] : TeacherPids(secret_)) {
      if (name.rfind("n2-", 0) == 0) return true;
    }
    return false;
  };
  ASSERT_TRUE(WaitFor(on_n2, milliseconds(60000))) << Diagnostics();
  client2->Kill(SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return !on_n2(); }, milliseconds(60000)))
      << "the killed client's teacher still runs";
  EXPECT_TRUE(
      WaitFor([&] { return TeacherPids(secret_).size() == 2 && ListedTeachers().size() == 2; },
              milliseconds(60000)))
      << Diagnostics();

  // An unknown service is a clear error.
  EXPECT_NE(Ctl({"scale", "--service", "nosuch", "1"}), 0);
  EXPECT_NE(Slurp(dir_.Join("ctl.log")).find("--service nosuch"), std::string::npos)
      << Slurp(dir_.Join("ctl.log"));

  // The client's exit stops its teachers.
  client->Stop(milliseconds(60000));
  EXPECT_TRUE(WaitFor([&] { return TeacherPids(secret_).empty(); }, milliseconds(60000)));
  EXPECT_TRUE(WaitFor([&] { return ListedTeachers().empty(); }, milliseconds(60000)))
      << Diagnostics();
}

// The same on a cluster server (`edl server --cluster`): services are scaled beside the jobs, a
// name that is neither a job nor an offered service is a clear error naming both.
TEST_F(DistillTest, ClusterServerScalesServicesBesideJobs) {
  TrainTeacherCheckpoint();
  if (HasFatalFailure()) return;
  server_ = std::make_unique<Proc>(
      std::vector<std::string>{test::EdlBinary(), "server", "--cluster", "--server_port", "0",
                               "--bind", "127.0.0.1", "--port_file", dir_.Join("port"),
                               "--secret_file", secret_, "--events_dir", dir_.Join("events")},
      dir_.Join("server.log"));
  port_ = itest::WaitForPortFile(dir_.Join("port"), server_.get());
  ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  auto client = std::make_unique<Proc>(
      std::vector<std::string>{
          test::EdlBinary(),
          "client",
          "--server",
          "127.0.0.1:" + port_,
          "--secret_file",
          secret_,
          "--node_name",
          "n1",
          "--slots",
          "1",
          "--socket_path",
          dir_.Join("n1.sock"),
          "--log_dir",
          dir_.Join("logs"),
          "--job_type",
          "sleeper = /bin/sleep 600",
          "--service",
          "kd = " + test::EdlBinary() + " teacher --model resnet20 --train_samples " + kSamples +
              " --checkpoint_dir " + dir_.Join("ckpt") + " --bind 127.0.0.1 --threads 1",
          "--teacher_slots",
          "1"},
      dir_.Join("client.log"));
  ASSERT_TRUE(WaitFor(
      [&] {
        return Ctl({"scale", "--service", "kd", "1"}) == 0;
      },
      milliseconds(60000)))
      << Slurp(dir_.Join("ctl.log")) << Diagnostics();
  ASSERT_TRUE(WaitFor([&] { return ListedTeachers() == std::set<std::string>{"n1-t1"}; },
                      milliseconds(120000)))
      << Diagnostics();
  ASSERT_EQ(Ctl({"status"}), 0);
  EXPECT_NE(Slurp(dir_.Join("ctl.log")).find("service kd: desired 1, placed 1 (n1-t1)"),
            std::string::npos)
      << Slurp(dir_.Join("ctl.log"));
  EXPECT_NE(Ctl({"scale", "--service", "nosuch", "1"}), 0);
  std::string err = Slurp(dir_.Join("ctl.log"));
  EXPECT_NE(err.find("no client offers a service 'nosuch'"), std::string::npos) << err;
  EXPECT_NE(err.find("--service nosuch ="), std::string::npos) << err;
  // A bare name does not say what it names: refused with both forms, nothing sent.
  EXPECT_EQ(Ctl({"scale", "kd", "1"}), 2);
  err = Slurp(dir_.Join("ctl.log"));
  EXPECT_NE(err.find("`edl ctl scale --service kd 1`"), std::string::npos) << err;
  ASSERT_EQ(Ctl({"scale", "--service", "kd", "0"}), 0) << Slurp(dir_.Join("ctl.log"));
  EXPECT_TRUE(WaitFor([&] { return TeacherPids(secret_).empty() && ListedTeachers().empty(); },
                      milliseconds(60000)))
      << Diagnostics();
  client->Stop(milliseconds(60000));
}

TEST_F(DistillTest, MismatchedTeacherAndUnknownServiceAreClearErrors) {
  // A checkpoint of the same model family for 100 classes (real RocksDB store): the 10-class
  // dataset cannot use it.
  ckpt::RocksDbStoreOptions so;
  so.dir = dir_.Join("ckpt100");
  ckpt::CheckpointMeta meta;
  meta.generation = 1;
  meta.fingerprint = "resnet20:1x28:100:0123456789abcdef;seed=1;train=1024";
  const float w = 0;
  ASSERT_OK(ckpt::OpenRocksDbStore(so)->Save(meta, {{"fc.bias", DataType::kFloat32, {1}, &w, 4}},
                                             nullptr));
  StartServer();
  if (HasFatalFailure()) return;
  auto bad = StartTeacher("t100", dir_.Join("ckpt100"));
  ASSERT_EQ(bad->Wait(milliseconds(120000)), 2) << Slurp(dir_.Join("t100.log"));
  const std::string log = Slurp(dir_.Join("t100.log"));
  EXPECT_NE(log.find("resnet20:1x28:100"), std::string::npos) << log;
  EXPECT_NE(log.find("makes resnet20:1x28:10:"), std::string::npos) << log;

  // A student naming a service nobody serves: a clear error after --distill_discovery_s.
  const int rc = itest::RunCommand({test::EdlBinary(),
                                    "train",
                                    "--model",
                                    "resnet20",
                                    "--train_samples",
                                    kSamples,
                                    "--batch_size",
                                    "16",
                                    "--max_steps",
                                    "2",
                                    "--threads",
                                    "1",
                                    "--eval",
                                    "false",
                                    "--distill",
                                    "nosuch",
                                    "--distill_server",
                                    "127.0.0.1:" + port_,
                                    "--secret_file",
                                    secret_,
                                    "--distill_discovery_s",
                                    "1",
                                    "--distill_wait_s",
                                    "1"},
                                   dir_.Join("student.log"), milliseconds(120000));
  const std::string out = Slurp(dir_.Join("student.log"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("--distill nosuch: no teacher of that service"), std::string::npos) << out;
  // The server is unharmed.
  EXPECT_EQ(server_->Wait(milliseconds(0)), -1);
}

}  // namespace
}  // namespace edl
