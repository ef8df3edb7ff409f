#include "edl/runtime/channel_membership.h"

#include "edl/net/trainer_channel.h"
#include "edl/proto/messages.h"

namespace edl::runtime {

Generation ToGeneration(const proto::GenerationInfo& info) {
  Generation g;
  g.number = info.generation;
  g.failure = info.failure;
  g.reason = info.reason;
  g.members.reserve(info.members.size());
  for (const proto::MemberInfo& m : info.members) {
    g.members.push_back(m.trainer_id);
    g.hosts.push_back(m.host);
  }
  return g;
}

namespace {

// Values on the wire are JSON strings, which must be UTF-8; rendezvous values (gloo's socket
// addresses, NCCL unique ids) are raw bytes, so they travel hex-encoded.
std::string HexEncode(const std::string& raw) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Status HexDecode(const std::string& key, const std::string& hex, std::string* raw) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) {
    return Status::Corruption("rendezvous value of '" + key + "' is not hex (odd length)");
  }
  raw->resize(hex.size() / 2);
  for (size_t i = 0; i < raw->size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return Status::Corruption("rendezvous value of '" + key +
                                "' is not hex; was it written "
                                "by something other than the elastic runtime?");
    }
    (*raw)[i] = static_cast<char>(hi << 4 | lo);
  }
  return Status::OK();
}

// The server's rendezvous KV through the channel. Keys are scoped by job at the server.
class ChannelKvStore : public KvStore {
 public:
  explicit ChannelKvStore(net::TrainerChannel* channel) : channel_(channel) {}
  Status Set(const std::string& key, const std::string& value) override {
    return channel_->KvSet(key, HexEncode(value));
  }
  Status Get(const std::string& key, std::string* value) override {
    std::string hex;
    EDL_RETURN_IF_ERROR(channel_->KvGet(key, &hex));
    return HexDecode(key, hex, value);
  }
  Status Wait(const std::string& key, std::chrono::milliseconds timeout,
              std::string* value) override {
    std::string hex;
    EDL_RETURN_IF_ERROR(channel_->KvWait(key, timeout, &hex));
    return HexDecode(key, hex, value);
  }

 private:
  net::TrainerChannel* const channel_;  // not owned; the ChannelMembership owning both outlives us
};

class ChannelMembership : public MembershipSource, public ServiceFeed {
 public:
  ChannelMembership(std::unique_ptr<net::TrainerChannel> channel, std::string trainer_id)
      : channel_(std::move(channel)), trainer_id_(std::move(trainer_id)), kv_(channel_.get()) {}

  std::string trainer_id() const override { return trainer_id_; }
  bool Latest(Generation* out) override {
    proto::GenerationInfo info;
    if (!channel_->Latest(&info)) return false;
    *out = ToGeneration(info);
    return true;
  }
  Status WaitGeneration(int64_t after, std::chrono::milliseconds timeout,
                        Generation* out) override {
    proto::GenerationInfo info;
    EDL_RETURN_IF_ERROR(channel_->WaitGeneration(after, timeout, &info));
    *out = ToGeneration(info);
    return Status::OK();
  }
  KvStore* kv() override { return &kv_; }
  Status ReportReady(int64_t generation) override { return channel_->ReportReady(generation); }
  Status ReportProgress(const ProgressInfo& p) override {
    net::ProgressReport r;
    r.generation = p.generation;
    r.step = p.step;
    r.epoch = p.epoch;
    r.loss = p.loss;
    r.images_per_sec = p.images_per_sec;
    r.world_size = p.world_size;
    r.accuracy = p.accuracy;
    r.samples = p.samples;
    r.noise_steps = p.noise_steps;
    r.grad_sqr = p.grad_sqr;
    r.grad_var = p.grad_var;
    r.noise_scale = p.noise_scale;
    r.compute_s_per_sample = p.compute_s_per_sample;
    r.sync_s = p.sync_s;
    r.batch = p.batch;
    r.batch_policy = p.batch_policy;
    return channel_->ReportProgress(r);
  }
  Status ReportEvent(const nlohmann::json& event) override { return channel_->ReportEvent(event); }
  ServiceFeed* service_feed() override { return this; }
  Status Watch(const std::string& service) override { return channel_->WatchService(service); }
  Status Next(const std::string& service, uint64_t* version, std::chrono::milliseconds timeout,
              proto::ServiceMembers* out) override {
    return channel_->WaitServiceMembers(service, version, timeout, out);
  }

 private:
  const std::unique_ptr<net::TrainerChannel> channel_;
  const std::string trainer_id_;
  ChannelKvStore kv_;  // uses channel_; declared after it
};

}  // namespace

std::unique_ptr<MembershipSource> NewChannelMembership(std::unique_ptr<net::TrainerChannel> channel,
                                                       std::string trainer_id) {
  return std::make_unique<ChannelMembership>(std::move(channel), std::move(trainer_id));
}

StatusOr<std::unique_ptr<MembershipSource>> ConnectChannelMembership(
    const std::string& socket, const std::string& trainer_id, std::chrono::milliseconds timeout) {
  auto ch = net::TrainerChannel::Connect(socket, trainer_id, timeout);
  if (!ch.ok()) return ch.status().WithContext("connecting to the edl client at " + socket);
  return NewChannelMembership(std::move(ch.value()), trainer_id);
}

}  // namespace edl::runtime
