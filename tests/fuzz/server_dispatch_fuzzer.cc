// Structure-aware fuzzing of the job server's decode and dispatch: a valid message of a node's
// client (every client frame, every trainer event kind) or of `edl ctl`, type-mutated by the
// input's bytes (tests/fuzz/json_mutation.h: fields replaced by every JSON type, removed,
// duplicated, huge, unknown ones added), is handed to a real Server through DecodePayload and
// Server::OnMessage (tests/fuzz/server_driver.h), without the connection's safety net: an
// exception from any part of the server is a crash here. After each input the server must still
// serve. The same text also goes through the client's decoder of trainer frames, the edge where a
// trainer's bytes enter a node. The server is made anew every kRenewEvery inputs, so that its
// events log and state stay bounded however long the run.
#include <stdlib.h>

#include <filesystem>

#include <glog/logging.h>
#include <memory>
#include <string>

#include "edl/proto/frames.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/json_mutation.h"
#include "tests/fuzz/peer_messages.h"
#include "tests/fuzz/server_driver.h"

namespace {

constexpr int kRenewEvery = 20000;

class Harness {
 public:
  Harness() {
    // The server logs a warning per refused frame: at fuzzing rates that is most of the time
    // spent, and none of it is checked. Errors still print (a handler error is logged as one).
    FLAGS_minloglevel = google::GLOG_ERROR;
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/edl-fuzz-dispatch-XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
  }
  ~Harness() {
    driver_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  edl::jobserver::ServerDriver* Driver() {
    if (driver_ == nullptr || ++uses_ > kRenewEvery) {
      driver_.reset();
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
        std::filesystem::remove_all(e.path(), ec);
      driver_ = std::make_unique<edl::jobserver::ServerDriver>(dir_);
      FUZZ_CHECK(driver_->start_status().ok());
      uses_ = 0;
    }
    return driver_.get();
  }

 private:
  std::string dir_;
  std::unique_ptr<edl::jobserver::ServerDriver> driver_;
  int uses_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edl;
  static Harness harness;
  jobserver::ServerDriver* d = harness.Driver();
  fuzz::ByteReader r(data, size);
  const bool from_ctl = r.Below(8) == 0;
  std::vector<nlohmann::json> seeds;
  if (from_ctl) {
    seeds = fuzz::CtlMessages();
  } else {
    const std::vector<std::string> trainers = d->NodeTrainers();
    const std::string trainer = trainers.empty() ? "n1-s0-1" : trainers[r.Below(trainers.size())];
    seeds = fuzz::NodeMessages(trainer, d->generation());
  }
  const std::string text = fuzz::Mutate(seeds[r.Below(seeds.size())], &r);
  if (from_ctl) {
    d->FromCtl(text);
  } else {
    d->FromNode(text);
    nlohmann::json msg;  // a trainer's frame at its node's client
    if (proto::DecodePayload(text.data(), text.size(), &msg).ok()) {
      proto::TrainerFrame frame;
      (void)proto::DecodeTrainerFrame(msg, &frame);
    }
  }
  FUZZ_CHECK(d->serving());
  return 0;
}
