// TeacherServer admission: connections that have not proved the cluster secret never hold one of
// --max_students (idle TCP connections from one address cannot lock students out: they push out
// each other, oldest first), and an authenticated student beyond --max_students gets a proven
// refusal that names the flag.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "edl/net/framed_socket.h"
#include "edl/proto/messages.h"
#include "teacher/teacher_server.h"
#include "tests/testutil.h"

namespace edl::teacher {
namespace {

using std::chrono::milliseconds;
const std::string kSecret = "0123456789abcdefghijklmnopqrstuvwxyzABCDEF";
constexpr int kClasses = 4;

std::unique_ptr<TeacherServer> StartTeacher(int max_students) {
  TeacherServerOptions o;
  o.bind_host = "127.0.0.1";
  o.service = "kd";
  o.name = "t0";
  o.secret = kSecret;
  o.max_students = max_students;
  o.unauthenticated = {/*max_total=*/8, /*max_per_source=*/4};
  // Far longer than the test waits: an idle connection that goes away went because it was pushed
  // out, not because its handshake timed out.
  o.handshake_timeout = milliseconds(600000);
  auto t = std::make_unique<TeacherServer>(
      o, kClasses,
      [](const std::vector<const proto::TeacherRequest*>& reqs, std::vector<float>* logits) {
        logits->clear();
        for (const proto::TeacherRequest* r : reqs) {
          logits->resize(logits->size() + r->indices.size() * kClasses, 1.0f);
        }
        return Status::OK();
      },
      nullptr);
  EXPECT_OK(t->Start());
  return t;
}

// A TCP connection that sends nothing (it never authenticates).
int IdleConnection(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// True once the peer closed `fd` before `end` (reads drain the challenge the teacher sent first).
bool ClosedByPeer(int fd, std::chrono::steady_clock::time_point end) {
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
  }
  return false;
}

// A student's handshake; the socket on success.
StatusOr<std::unique_ptr<net::FramedSocket>> Student(int port) {
  auto sock = net::FramedSocket::ConnectTcp("127.0.0.1", port, milliseconds(10000));
  if (!sock.ok()) return sock.status();
  proto::Hello hello;
  hello.role = proto::Role::kStudent;
  hello.service = "kd";
  proto::Welcome w;
  EDL_RETURN_IF_ERROR(
      net::AuthenticateToServer(sock.value().get(), kSecret, hello, milliseconds(30000), &w));
  return std::move(sock.value());
}

TEST(TeacherAdmissionTest, IdleConnectionsNeverTakeStudentSlots) {
  auto teacher = StartTeacher(/*max_students=*/2);
  // Ten times the student bound, none of them ever authenticating.
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(IdleConnection(teacher->port()));
  auto a = Student(teacher->port());
  ASSERT_TRUE(a.ok()) << "the first student was locked out: " << a.status().ToString();
  auto b = Student(teacher->port());
  ASSERT_TRUE(b.ok()) << "the second student was locked out: " << b.status().ToString();
  // At most 4 of one address wait: the older idle ones were closed to make room (oldest first).
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (size_t i = 0; i + 4 < idle.size(); ++i) {
    EXPECT_TRUE(ClosedByPeer(idle[i], end)) << "idle connection " << i << " was kept";
  }
  // A third authenticated student is refused, with proof and the flag named.
  auto c = Student(teacher->port());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().ToString().find("--max_students"), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().ToString().find("2 students"), std::string::npos) << c.status().ToString();
  // A student that leaves frees its slot.
  a.value().reset();
  StatusOr<std::unique_ptr<net::FramedSocket>> d = Status::Unavailable("not tried");
  for (int i = 0; i < 600 && !d.ok(); ++i) {
    d = Student(teacher->port());
    if (!d.ok()) std::this_thread::sleep_for(milliseconds(50));  // until the teacher saw it go
  }
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  for (int fd : idle) ::close(fd);
  teacher->Stop();
}

}  // namespace
}  // namespace edl::teacher
