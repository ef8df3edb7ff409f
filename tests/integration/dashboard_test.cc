// `edl server --http_addr` with real processes (docs/WATCHING.md): a real `edl server`,
// two `edl client`s running the stand-in trainer, `edl ctl scale`, and
//  - Debian's Prometheus, started here on loopback with a generated config, scraping the server:
//    its query API returns the job's world size after the scale;
//  - headless Chromium loading the dashboard: the rendered DOM holds the job's row with its world
//    size after the scale and a generation change in the timeline;
//  - on a non-loopback address: the token rules at start, 401 without or with a wrong token, and
//    hostile requests that get a 4xx or a closed connection while the control plane goes on;
//  - a cluster server (--cluster): a submitted job's metrics, its timeline, the node's utilisation.
// Each tool is skipped, with the reason printed, where it is not installed.
#include <filesystem>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>

#include "tests/http_client.h"
#include "tests/integration/control_plane_harness.h"

namespace edl::itest {
namespace {

class DashboardTest : public ControlPlaneHarness {
 protected:
  // A single-job server with the HTTP endpoint at `http_addr` (port 0: any), two clients of two
  // slots, two trainers running.
  void StartJob(const std::string& http_addr = "127.0.0.1:0", std::vector<std::string> extra = {}) {
    extra.insert(extra.end(),
                 {"--http_addr", http_addr, "--http_port_file", dir_.Join("http.port")});
    StartServer("", 2, extra);
    if (HasFatalFailure()) return;
    const std::string p =
        WaitForPortFile(dir_.Join("http.port"), server_.get(), milliseconds(5000));
    ASSERT_FALSE(p.empty()) << "the HTTP port is written before the server's own" << Diagnostics();
    http_port_ = std::stoi(p);
    c1_ = StartClient("n1", "inplace");
    c2_ = StartClient("n2", "inplace");
    ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["world_size_after"] == 2; },
                                  milliseconds(60000)))
        << Diagnostics();
  }

  json Status(const std::map<std::string, std::string>& headers = {}) {
    const test::HttpReply r = test::HttpGet(http_host_, http_port_, "/api/status", headers);
    return r.status == 200 ? json::parse(r.body, nullptr, false) : json();
  }

  // `edl ctl scale 3`, then waits until the server's status says so and the job re-formed.
  void ScaleToThree(const std::map<std::string, std::string>& headers = {}) {
    std::string out;
    ASSERT_EQ(Ctl({"scale", "3"}, &out), 0) << out;
    ASSERT_TRUE(
        WaitFor([&] { return Status(headers).value("world_size", 0) == 3; }, milliseconds(60000)))
        << Diagnostics();
  }

  void StopJob() {
    std::string out;
    ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
    EXPECT_EQ(server_->Wait(milliseconds(20000)), 0) << Diagnostics();
    EXPECT_EQ(c1_->Wait(milliseconds(20000)), 0);
    EXPECT_EQ(c2_->Wait(milliseconds(20000)), 0);
    const std::string log = Slurp(dir_.Join("server.log"));
    EXPECT_EQ(log.find("Sanitizer"), std::string::npos) << log;
  }

  std::string http_host_ = "127.0.0.1";
  int http_port_ = 0;
  std::unique_ptr<Proc> c1_, c2_;
};

TEST_F(DashboardTest, PrometheusScrapesTheServerAndSeesAScale) {
  if (::access("/usr/bin/prometheus", X_OK) != 0) {
    GTEST_SKIP() << "no /usr/bin/prometheus (Debian package prometheus; scripts/install_deps.sh "
                    "installs it)";
  }
  StartJob();
  if (HasFatalFailure()) return;
  const int prom_port = FreePort();
  std::ofstream(dir_.Join("prometheus.yml"))
      << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
      << "scrape_configs:\n  - job_name: edl\n    static_configs:\n      - targets: ['127.0.0.1:"
      << http_port_ << "']\n";
  Proc prom({"/usr/bin/prometheus", "--config.file=" + dir_.Join("prometheus.yml"),
             "--storage.tsdb.path=" + dir_.Join("tsdb"),
             "--web.listen-address=127.0.0.1:" + std::to_string(prom_port),
             "--storage.tsdb.retention.time=1h", "--log.level=warn"},
            dir_.Join("prometheus.log"));
  auto query = [&](const std::string& q) -> json {
    std::string enc;
    for (unsigned char c : q) {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      enc += std::isalnum(c) ? std::string(1, static_cast<char>(c)) : std::string(buf);
    }
    const test::HttpReply r = test::HttpGet("127.0.0.1", prom_port, "/api/v1/query?query=" + enc);
    const json j = r.status == 200 ? json::parse(r.body, nullptr, false) : json();
    const json& res = j.is_object() ? j["data"]["result"] : json();
    return res.is_array() && !res.empty() ? res[0]["value"][1] : json();
  };
  ASSERT_TRUE(WaitFor([&] { return query("up{job=\"edl\"}") == "1"; }, milliseconds(60000)))
      << "Prometheus never scraped the server\n"
      << Slurp(dir_.Join("prometheus.log"), 4000);
  EXPECT_EQ(query("edl_job_trainers{job_name=\"itest\"}"), "2");
  ScaleToThree();
  if (HasFatalFailure()) return;
  EXPECT_TRUE(WaitFor([&] { return query("edl_job_trainers{job_name=\"itest\"}") == "3"; },
                      milliseconds(30000)))
      << Slurp(dir_.Join("prometheus.log"), 4000);
  EXPECT_TRUE(
      WaitFor([&] { return query("sum(edl_job_generations_total{job_name=\"itest\"})") == "2"; },
              milliseconds(30000)));
  EXPECT_EQ(query("edl_node_slots{node=\"n1\"}"), "2");
  // The text is what promtool accepts.
  const test::HttpReply metrics = test::HttpGet("127.0.0.1", http_port_, "/metrics");
  ASSERT_EQ(metrics.status, 200) << metrics.error;
  std::ofstream(dir_.Join("metrics.txt")) << metrics.body;
  EXPECT_EQ(
      RunCommand({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + dir_.Join("metrics.txt")},
                 dir_.Join("promtool.out"), milliseconds(60000)),
      0)
      << Slurp(dir_.Join("promtool.out"));
  prom.Stop();
  EXPECT_EQ(prom.Wait(milliseconds(0)), 0) << "Prometheus exits 0 on SIGTERM\n"
                                           << Slurp(dir_.Join("prometheus.log"), 4000);
  StopJob();
}

TEST_F(DashboardTest, ChromiumRendersTheJobItsScaleAndTheGenerationChange) {
  if (::access("/usr/bin/chromium", X_OK) != 0) {
    GTEST_SKIP()
        << "no /usr/bin/chromium (Debian package chromium; scripts/install_deps.sh installs it)";
  }
  StartJob();
  if (HasFatalFailure()) return;
  ScaleToThree();
  if (HasFatalFailure()) return;
  // A trainer dies: the failure is listed and flagged on the timeline, however soon a grow-back
  // follows it.
  const auto pids = Pids();
  ASSERT_FALSE(pids.empty()) << Diagnostics();
  ASSERT_EQ(::kill(*pids.begin()->second.rbegin(), SIGKILL), 0);
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g.value("failure", false); },
                                milliseconds(60000)))
      << Diagnostics();
  // The page polls once a second; virtual time lets its timers run without waiting in real time,
  // and stands still while a request is in flight.
  const std::string url = "http://127.0.0.1:" + std::to_string(http_port_) + "/#job=itest";
  std::string dom;
  Proc chrome({"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", "--user-data-dir=" + dir_.Join("chromium"),
               "--virtual-time-budget=5000", "--dump-dom", url},
              dir_.Join("chromium.out"));
  const int rc = chrome.Wait(milliseconds(120000));
  if (rc < 0) chrome.Stop();
  ASSERT_EQ(rc, 0) << Slurp(dir_.Join("chromium.out"), 4000);
  dom = Slurp(dir_.Join("chromium.out"));
  // The job's row, with the world size after the scale.
  std::smatch row;
  ASSERT_TRUE(std::regex_search(dom, row, std::regex("<tr[^>]*id=\"job-itest\"[^>]*>")))
      << "no row for job itest in the rendered page:\n"
      << dom.substr(0, 8000);
  EXPECT_NE(row.str().find("data-world-size=\"3\""), std::string::npos) << row.str();
  EXPECT_NE(row.str().find("data-state=\"running\""), std::string::npos) << row.str();
  // What the job measures of itself, as its (stand-in) trainers report it.
  EXPECT_NE(row.str().find("data-noise-scale=\"125.0\""), std::string::npos) << row.str();
  EXPECT_NE(row.str().find("data-compute-ms=\"2.500\""), std::string::npos) << row.str();
  // A generation change drawn in each timeline panel: the scale's generation, 2.
  std::smatch mark;
  EXPECT_TRUE(
      std::regex_search(dom, mark,
                        std::regex("<line[^>]*class=\"gen-mark\"[^>]*data-generation=\"2\"|"
                                   "<line[^>]*data-generation=\"2\"[^>]*class=\"gen-mark\"")))
      << dom.substr(0, 8000);
  EXPECT_NE(dom.find("data-node=\"n1\""), std::string::npos) << "the nodes table";
  EXPECT_NE(dom.find("live, updated"), std::string::npos) << "the page updated itself";
  EXPECT_NE(dom.find("class=\"trainer\""), std::string::npos) << "the trainers table";
  EXPECT_TRUE(std::regex_search(dom, std::regex("<tr[^>]*class=\"reform failure\"")))
      << "the failure is not listed:\n"
      << dom.substr(0, 8000);
  EXPECT_NE(dom.find("class=\"failure-flag\""), std::string::npos)
      << "no failure flag on the timeline";
  StopJob();
}

TEST_F(DashboardTest, OffLoopbackATokenIsRequiredAndHostileRequestsDoNotStopTheJob) {
  const std::string addr = NonLoopbackAddress();
  if (addr.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to bind";
  const std::string token = "dGhlLWRhc2hib2FyZC10b2tlbi0wMTIzNDU2Nzg5YWJj";
  // Refused at start: no token, or a token file others can read.
  std::string out;
  std::vector<std::string> base = {
      test::EdlBinary(), "server",       "--server_port",      "0",           "--secret_file",
      secret_,           "--events_dir", dir_.Join("events0"), "--http_addr", addr + ":0"};
  EXPECT_EQ(RunCommand(base, dir_.Join("refused1.log")), 2);
  EXPECT_NE(Slurp(dir_.Join("refused1.log")).find("--http_token_file"), std::string::npos)
      << Slurp(dir_.Join("refused1.log"));
  std::ofstream(dir_.Join("token.open")) << token << "\n";
  std::filesystem::permissions(dir_.Join("token.open"), std::filesystem::perms(0644));
  base.insert(base.end(), {"--http_token_file", dir_.Join("token.open")});
  EXPECT_EQ(RunCommand(base, dir_.Join("refused2.log")), 2);
  EXPECT_NE(Slurp(dir_.Join("refused2.log")).find("chmod 600"), std::string::npos)
      << Slurp(dir_.Join("refused2.log"));

  WriteSecretFile(dir_.Join("token"), token);
  StartJob(addr + ":0", {"--http_token_file", dir_.Join("token")});
  if (HasFatalFailure()) return;
  http_host_ = addr;
  const std::map<std::string, std::string> auth = {{"Authorization", "Bearer " + token}};
  EXPECT_EQ(test::HttpGet(addr, http_port_, "/api/status").status, 401);
  EXPECT_EQ(
      test::HttpGet(addr, http_port_, "/metrics", {{"Authorization", "Bearer " + token + "A"}})
          .status,
      401);
  EXPECT_EQ(
      test::HttpGet(addr, http_port_, "/metrics", {{"Authorization", "Bearer " + token}}).status,
      200);
  EXPECT_EQ(test::HttpGet(addr, http_port_, "/").status, 200)
      << "the page asks for the token itself";
  // Loopback is not served: the endpoint listens on the address it was given only.
  EXPECT_NE(test::HttpGet("127.0.0.1", http_port_, "/metrics", auth).status, 200);

  // Hostile requests: slow heads held open, oversize, a body, traversal; the job goes on.
  boost::asio::io_context cio;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::socket>> slow;
  for (int i = 0; i < 20; ++i) {
    auto s = std::make_unique<boost::asio::ip::tcp::socket>(cio);
    boost::system::error_code ec;
    s->connect({boost::asio::ip::make_address(addr), static_cast<uint16_t>(http_port_)}, ec);
    if (!ec)
      boost::asio::write(*s, boost::asio::buffer(std::string("GET /metrics HTTP/1.1\r\nX: ")), ec);
    slow.push_back(std::move(s));
  }
  EXPECT_EQ(test::HttpGet(addr, http_port_, "/../../etc/passwd", auth).status, 404);
  EXPECT_EQ(
      test::HttpGet(addr, http_port_, "/api/status",
                    {{"Authorization", "Bearer " + token}, {"X-Big", std::string(16000, 'x')}})
          .status,
      431);
  ScaleToThree(auth);
  if (HasFatalFailure()) return;
  const json st = Status(auth);  // kept: a loop over a temporary's member would read freed memory
  EXPECT_EQ(st["nodes"].size(), 2u);
  for (const json& n : st["nodes"]) EXPECT_EQ(n["connected"], true) << n.dump();
  slow.clear();
  StopJob();
}

TEST_F(DashboardTest, AClusterServersJobsAndNodes) {
  server_ = std::make_unique<Proc>(
      std::vector<std::string>{test::EdlBinary(), "server", "--cluster", "--server_port", "0",
                               "--bind", "127.0.0.1", "--port_file", dir_.Join("port"),
                               "--secret_file", secret_, "--events_dir", dir_.Join("events"),
                               "--http_addr", "127.0.0.1:0", "--http_port_file",
                               dir_.Join("http.port")},
      dir_.Join("server.log"));
  port_ = WaitForPortFile(dir_.Join("port"), server_.get());
  ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  http_port_ = std::stoi(Slurp(dir_.Join("http.port")));
  c1_ = StartClient("n1", "inplace", "",
                    {{"job_type", std::string("standin = ") + STAND_IN_TRAINER}});
  std::ofstream(dir_.Join("a.ini")) << "name = a\ntype = standin\nmin = 1\nmax = 2\n";
  std::string out;
  ASSERT_TRUE(WaitFor(
      [&] {
        return Slurp(dir_.Join("server.log")).find("node n1 registered") != std::string::npos;
      },
      milliseconds(30000)))
      << Diagnostics();
  ASSERT_EQ(Ctl({"submit", dir_.Join("a.ini")}, &out), 0) << out;
  auto metric = [&](const std::string& line) {
    return test::HttpGet("127.0.0.1", http_port_, "/metrics").body.find("\n" + line + "\n") !=
           std::string::npos;
  };
  EXPECT_TRUE(
      WaitFor([&] { return metric("edl_job_trainers{job_name=\"a\"} 2"); }, milliseconds(30000)))
      << test::HttpGet("127.0.0.1", http_port_, "/metrics").body;
  EXPECT_TRUE(metric("edl_job_state{job_name=\"a\",state=\"running\"} 1"));
  EXPECT_TRUE(metric("edl_server_info{mode=\"cluster\"} 1"));
  EXPECT_TRUE(metric("edl_cluster_slots 2"));
  // The node's utilisation, from its node_stats reports (a cluster's clients send them).
  EXPECT_TRUE(WaitFor(
      [&] {
        return test::HttpGet("127.0.0.1", http_port_, "/metrics")
                   .body.find("edl_node_cpu_utilization_ratio{node=\"n1\"}") != std::string::npos;
      },
      milliseconds(30000)));
  const json events = json::parse(
      test::HttpGet("127.0.0.1", http_port_, "/api/events?job=a&since=0").body, nullptr, false);
  ASSERT_TRUE(events.is_object());
  bool generation = false;
  for (const json& r : events["records"])
    generation |= r["type"] == "generation" && r["world_size_after"] == 2;
  EXPECT_TRUE(generation) << events.dump();
  c1_->Stop();
  EXPECT_EQ(c1_->Wait(milliseconds(0)), 0) << Slurp(dir_.Join("n1.log"), 4000);
  server_->Stop();
  EXPECT_EQ(server_->Wait(milliseconds(0)), 0) << Diagnostics();
}

}  // namespace
}  // namespace edl::itest
