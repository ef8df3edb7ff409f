// TeacherServer (teacher/teacher_server.h) and TeacherClient (edl/runtime/teacher_client.h) over
// real sockets in one process, with a stand-in model whose logits are a known function of the
// sample index: answers match the model (full and top-k), concurrent requests are batched into one
// forward pass, a teacher stopped with requests in flight is replaced by another, a step never
// waits longer than the bound (labels only, counted), and teachers answering with the wrong shape
// or for another service are dropped with a clear error while the others keep answering, and
// abandoned requests (cancelled, or of a closed connection) are dropped, not computed.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "edl/net/framed_socket.h"
#include "edl/proto/service_messages.h"
#include "edl/runtime/teacher_client.h"
#include "teacher/teacher_server.h"
#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl::teacher {
namespace {

using std::chrono::milliseconds;
constexpr int kClasses = 10;
const std::string kSecret = "0123456789abcdefghijklmnopqrstuvwxyzABCDEF";

float Logit(int64_t index, int c, uint64_t seed) {
  return static_cast<float>((index % 13) * 0.25 + c * 0.5 - ((c + index) % 4) + (seed % 3) * 0.125);
}

// A gate the stand-in model can wait on (to hold requests in flight).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = true;
  void Close() {
    std::lock_guard<std::mutex> l(mu);
    open = false;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> l(mu);
      open = true;
    }
    cv.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [this] { return open; });
  }
};

// A teacher with the stand-in model; records how many requests each forward pass took.
class FakeModelTeacher {
 public:
  explicit FakeModelTeacher(const std::string& service, int classes = kClasses,
                            const std::string& name = "t") {
    TeacherServerOptions o;
    o.bind_host = "127.0.0.1";
    o.service = service;
    o.name = name;
    o.secret = kSecret;
    server_ = std::make_unique<TeacherServer>(
        o, classes,
        [this, classes](const std::vector<const proto::TeacherRequest*>& reqs,
                        std::vector<float>* logits) {
          started++;
          gate.Wait();
          logits->clear();
          for (const proto::TeacherRequest* r : reqs) {
            for (int64_t i : r->indices) {
              for (int c = 0; c < classes; ++c) logits->push_back(Logit(i, c, r->aug_seed));
            }
          }
          std::lock_guard<std::mutex> l(mu_);
          pass_sizes_.push_back(reqs.size());
          return Status::OK();
        },
        nullptr);
    EXPECT_OK(server_->Start());
  }
  ~FakeModelTeacher() {
    gate.Open();
    server_->Stop();
  }
  std::string addr() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  TeacherServer* server() { return server_.get(); }
  size_t largest_pass() {
    std::lock_guard<std::mutex> l(mu_);
    size_t m = 0;
    for (size_t s : pass_sizes_) m = std::max(m, s);
    return m;
  }
  Gate gate;
  std::atomic<int> started{0};  // forward passes begun

 private:
  std::unique_ptr<TeacherServer> server_;
  std::mutex mu_;
  std::vector<size_t> pass_sizes_;
};

runtime::TeacherClientOptions ClientOptions(const std::vector<std::string>& teachers) {
  runtime::TeacherClientOptions o;
  o.service = "kd";
  o.teachers = teachers;
  o.secret = kSecret;
  o.classes = kClasses;
  o.answer_wait = milliseconds(20000);  // generous: these tests wait on answers, not time
  o.resend_after = milliseconds(20000);
  o.max_inflight_per_teacher = 8;
  return o;
}

std::vector<int64_t> Batch(int step, int n = 16) {
  std::vector<int64_t> b;
  for (int i = 0; i < n; ++i) b.push_back(step * 1000 + i * 7);
  return b;
}

// Gets a batch and checks every row against the stand-in model (top_k: only the k largest).
void ExpectAnswered(runtime::TeacherClient* c, const std::vector<int64_t>& b, uint64_t seed,
                    int top_k = 0) {
  std::vector<float> rows(b.size() * kClasses);
  std::vector<uint8_t> has(b.size());
  ASSERT_OK(c->Get(b, seed, kClasses, rows.data(), has.data()));
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_EQ(has[i], 1) << "sample " << b[i];
    std::vector<float> want(kClasses);
    for (int k = 0; k < kClasses; ++k) want[k] = Logit(b[i], k, seed);
    std::vector<float> sorted = want;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    for (int k = 0; k < kClasses; ++k) {
      const float got = rows[i * kClasses + k];
      if (top_k > 0 && want[k] < sorted[top_k - 1]) {
        EXPECT_EQ(got, -std::numeric_limits<float>::infinity()) << "class " << k;
      } else {
        EXPECT_FLOAT_EQ(got, want[k]) << "sample " << b[i] << " class " << k;
      }
    }
  }
}

bool WaitFor(const std::function<bool()>& pred) {
  return itest::WaitFor(pred, milliseconds(60000));
}

TEST(TeacherServiceTest, AnswersMatchTheModelAndConcurrentRequestsShareAPass) {
  FakeModelTeacher t("kd");
  auto c = runtime::TeacherClient::Create(ClientOptions({t.addr()}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ExpectAnswered(c.value().get(), Batch(0), 5);  // connected and answering
  // Hold the model in a pass, queue four more requests behind it: the next pass takes them all.
  t.gate.Close();
  c.value()->Request(Batch(1), 1);
  ASSERT_TRUE(WaitFor([&] { return t.started == 2; }));
  for (int s = 2; s <= 5; ++s) c.value()->Request(Batch(s), s);
  ASSERT_TRUE(WaitFor([&] { return t.server()->queued() >= 4; })) << t.server()->queued();
  t.gate.Open();
  for (int s = 1; s <= 5; ++s) ExpectAnswered(c.value().get(), Batch(s), s);
  EXPECT_GE(t.largest_pass(), 4u);
  const runtime::TeacherCounters n = c.value()->counters();
  EXPECT_EQ(n.answered, 6 * 16);
  EXPECT_EQ(n.fallback, 0);
  EXPECT_EQ(t.server()->Totals().samples, 6 * 16);
}

TEST(TeacherServiceTest, TopKAnswersCarryTheirClasses) {
  FakeModelTeacher t("kd");
  runtime::TeacherClientOptions o = ClientOptions({t.addr()});
  o.top_k = 3;
  auto c = runtime::TeacherClient::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ExpectAnswered(c.value().get(), Batch(3), 11, /*top_k=*/3);
}

TEST(TeacherServiceTest, StoppedTeacherIsReplacedWithoutLosingAnAnswer) {
  auto a = std::make_unique<FakeModelTeacher>("kd", kClasses, "a");
  FakeModelTeacher b("kd", kClasses, "b");
  auto c = runtime::TeacherClient::Create(ClientOptions({a->addr(), b.addr()}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return c.value()->Connected().size() == 2; }));
  a->gate.Close();  // requests that reach `a` stay in flight until it dies
  for (int s = 0; s < 8; ++s) c.value()->Request(Batch(s), s);
  ASSERT_TRUE(WaitFor([&] { return a->started == 1; }));
  // `a` goes away with requests in flight: its connections close first, then its pass ends with
  // nobody to answer.
  std::thread stopper([&] { a->server()->Stop(); });
  ASSERT_TRUE(WaitFor([&] { return c.value()->Connected().size() == 1; }));
  a->gate.Open();
  stopper.join();
  for (int s = 0; s < 8; ++s) ExpectAnswered(c.value().get(), Batch(s), s);
  const runtime::TeacherCounters n = c.value()->counters();
  EXPECT_EQ(n.answered, 8 * 16);
  EXPECT_EQ(n.fallback, 0);
  EXPECT_GE(n.resent, 1);
}

TEST(TeacherServiceTest, NoAnswerWithinTheBoundFallsBackToLabelsAndIsCounted) {
  FakeModelTeacher t("kd");
  runtime::TeacherClientOptions o = ClientOptions({t.addr()});
  o.answer_wait = milliseconds(100);
  auto c = runtime::TeacherClient::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return c.value()->Connected().size() == 1; }));
  t.gate.Close();
  const std::vector<int64_t> b = Batch(4);
  std::vector<float> rows(b.size() * kClasses);
  std::vector<uint8_t> has(b.size(), 7);
  ASSERT_OK(c.value()->Get(b, 3, kClasses, rows.data(), has.data()));
  for (uint8_t h : has) EXPECT_EQ(h, 0);
  EXPECT_EQ(c.value()->counters().fallback, 16);
  EXPECT_EQ(c.value()->counters().answered, 0);
  t.gate.Open();
}

// Requests nobody will read are not computed: a student whose step went on without an answer
// cancels the request (teacher_cancel) and the teacher drops it from its queue; a student that
// closes its connection leaves nothing queued behind.
TEST(TeacherServiceTest, AbandonedRequestsAreDroppedNotComputed) {
  FakeModelTeacher t("kd");
  runtime::TeacherClientOptions o = ClientOptions({t.addr()});
  o.answer_wait = milliseconds(50);
  auto c = runtime::TeacherClient::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return c.value()->Connected().size() == 1; }));
  t.gate.Close();
  c.value()->Request(Batch(0), 0);  // held in the model
  ASSERT_TRUE(WaitFor([&] { return t.started == 1; }));
  for (int s = 1; s <= 4; ++s) c.value()->Request(Batch(s), s);  // queued behind it
  ASSERT_TRUE(WaitFor([&] { return t.server()->queued() == 4; })) << t.server()->queued();
  std::vector<float> rows(16 * kClasses);
  std::vector<uint8_t> has(16);
  for (int s = 1; s <= 4; ++s) {  // the steps go on on labels only
    ASSERT_OK(c.value()->Get(Batch(s), s, kClasses, rows.data(), has.data()));
    EXPECT_EQ(has[0], 0);
  }
  ASSERT_TRUE(WaitFor([&] {
    return t.server()->queued() == 0 && t.server()->Totals().cancelled == 4;
  })) << t.server()->queued()
      << " queued, " << t.server()->Totals().cancelled << " cancelled";
  EXPECT_EQ(c.value()->counters().cancelled, 4);
  t.gate.Open();
  // Only the request already in the model was computed.
  ASSERT_TRUE(WaitFor([&] { return t.server()->Totals().requests == 1; }));
  EXPECT_EQ(t.server()->Totals().samples, 16);
  EXPECT_EQ(t.started, 1);

  // A student leaves with requests queued: they are dropped with its connection.
  t.gate.Close();
  auto gone = runtime::TeacherClient::Create(ClientOptions({t.addr()}));
  ASSERT_TRUE(gone.ok()) << gone.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return gone.value()->Connected().size() == 1; }));
  gone.value()->Request(Batch(10), 10);
  ASSERT_TRUE(WaitFor([&] { return t.started == 2; }));
  for (int s = 11; s <= 13; ++s) gone.value()->Request(Batch(s), s);
  ASSERT_TRUE(WaitFor([&] { return t.server()->queued() == 3; })) << t.server()->queued();
  gone.value().reset();
  ASSERT_TRUE(WaitFor([&] {
    return t.server()->queued() == 0 && t.server()->Totals().orphaned == 3;
  })) << t.server()->queued()
      << " queued, " << t.server()->Totals().orphaned << " orphaned";
  t.gate.Open();
  ASSERT_TRUE(WaitFor([&] { return t.server()->Totals().requests == 2; }));
  EXPECT_EQ(t.started, 2);  // no pass for the dropped ones
}

// A teacher that authenticates properly but answers every request with one row too few.
class ShortRowsTeacher {
 public:
  ShortRowsTeacher() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ShortRowsTeacher() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
  std::atomic<int> answered{0};

 private:
  void Serve() {
    while (!stop_) {
      const int cfd = ::accept(fd_, nullptr, nullptr);
      if (cfd < 0) return;
      net::FramedSocket s(cfd, "student");
      proto::Welcome w;
      w.job_id = "kd";
      proto::Hello h;
      if (!net::AuthenticatePeer(&s, kSecret, w, milliseconds(5000), &h, [](const proto::Hello&) {
             return Status::OK();
           }).ok()) {
        continue;
      }
      nlohmann::json j;
      while (s.Receive(&j, milliseconds(20000)).ok()) {
        proto::TeacherRequest r;
        if (!r.DecodeFrom(j).ok()) break;
        proto::TeacherReply rep;
        rep.req_id = r.req_id;
        rep.classes = kClasses;
        rep.rows = static_cast<int>(r.indices.size()) - 1;
        rep.k = kClasses;
        rep.values.assign(static_cast<size_t>(rep.rows) * kClasses, 1.f);
        rep.EncodeTo(&j);
        if (!s.Send(j, milliseconds(5000)).ok()) break;
        answered++;
      }
    }
  }
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(TeacherServiceTest, WrongShapeAndWrongServiceTeachersAreDroppedOthersAnswer) {
  ShortRowsTeacher bad_rows;
  FakeModelTeacher bad_classes("kd", /*classes=*/7, "seven");
  FakeModelTeacher other_service("not-kd", kClasses, "other");
  FakeModelTeacher good("kd", kClasses, "good");
  auto c = runtime::TeacherClient::Create(
      ClientOptions({bad_rows.addr(), bad_classes.addr(), other_service.addr(), good.addr()}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int s = 0; s < 12; ++s) ExpectAnswered(c.value().get(), Batch(s), s);
  EXPECT_EQ(c.value()->counters().fallback, 0);
  EXPECT_EQ(other_service.server()->Totals().requests, 0);  // refused at the handshake
}

TEST(TeacherServiceTest, BadOptionsAreRefusedByName) {
  runtime::TeacherClientOptions o = ClientOptions({});
  auto c = runtime::TeacherClient::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().ToString().find("--distill_server"), std::string::npos)
      << c.status().ToString();
  o.teachers = {"no-port"};
  c = runtime::TeacherClient::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().ToString().find("HOST:PORT"), std::string::npos) << c.status().ToString();
}

}  // namespace
}  // namespace edl::teacher
