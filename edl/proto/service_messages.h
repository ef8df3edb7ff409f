// Messages of inference services (edl/proto/PROTOCOL.md, "Services"): a teacher registering with
// the server and reporting its load, the server pushing a service's member list to the students
// that watch it, and a student asking a teacher for the logits of training samples. Same style
// as messages.h: EncodeTo / DecodeFrom (validating every field, Corruption naming the message and
// the field) / DebugString.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/proto/messages.h"

namespace edl::proto {

namespace msg {
inline constexpr char kServiceStats[] = "service_stats";      // teacher -> server, every heartbeat
inline constexpr char kServiceMembers[] = "service_members";  // server -> student (watching)
inline constexpr char kTeacherRequest[] = "teacher_request";  // student -> teacher
inline constexpr char kTeacherReply[] = "teacher_reply";      // teacher -> student
inline constexpr char kTeacherCancel[] = "teacher_cancel";    // student -> teacher: gave up on one
inline constexpr char kServiceWatch[] = "service_watch";      // trainer -> client -> server
inline constexpr char kTeacherStart[] = "teacher_start";      // server -> client: run a teacher
inline constexpr char kTeacherStop[] = "teacher_stop";        // server -> client: stop one
inline constexpr char kTeacherExit[] = "teacher_exit";        // client -> server: one ended
}  // namespace msg

constexpr size_t kMaxTeacherBatch = 4096;    // samples per teacher_request
constexpr int kMaxTeacherClasses = 10000;    // logits per sample
constexpr size_t kMaxServiceMembers = 1024;  // teachers listed per service
// A reply of kMaxTeacherBatch x kMaxTeacherClasses floats would not fit a frame: a teacher refuses
// a request whose answer would exceed this many values (students ask top-k or smaller batches).
constexpr size_t kMaxTeacherValues = 160000;
// Teacher processes one client runs at once (its --teacher_slots).
constexpr int kMaxTeacherSlots = 64;
constexpr size_t kMaxTeacherWhyBytes = 256;

// The student gave up on request `req_id` (answered elsewhere, or its step went on without it):
// a teacher that has not started it drops it and answers Aborted at once.
struct TeacherCancel : Message<TeacherCancel> {
  uint64_t req_id = 0;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// A trainer asks its node's client for a service's member lists; the client asks the server once
// for all its trainers and relays each service_members push to every trainer watching.
struct ServiceWatch : Message<ServiceWatch> {
  std::string service;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// A client's teachers (PROTOCOL.md, "Services: teachers run by clients"): the server orders a
// start or a stop, the client reports each teacher that ended. One shape for the three message
// types, whose names are the order's kinds.
enum class TeacherOrderType { kStart, kStop, kExit };
inline constexpr EnumNames<TeacherOrderType, 3> kTeacherOrderNames({msg::kTeacherStart,
                                                                    msg::kTeacherStop,
                                                                    msg::kTeacherExit});
inline const char* NameOf(TeacherOrderType t) { return kTeacherOrderNames.Name(t); }

struct TeacherOrder : Message<TeacherOrder> {
  TeacherOrderType type = TeacherOrderType::kStart;
  std::string service;  // the service's name (the client's --service NAME)
  std::string name;     // the teacher's name in its service
  std::string why;      // kExit: how it ended ("exit 1", ...)
  void EncodeTo(nlohmann::json* j) const;
  // Accepts any of the three types; `why` only in kTeacherExit, printable, bounded.
  Status DecodeFrom(const nlohmann::json& j);
};

// A teacher's load since its previous report.
struct ServiceStats : Message<ServiceStats> {
  int64_t requests = 0;   // requests answered in the period
  int64_t samples = 0;    // samples answered in the period
  double period_s = 0;    // length of the period
  double latency_ms = 0;  // mean time from receiving a request to sending its answer
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

struct ServiceMember {
  std::string name;  // the teacher's name (Hello::node)
  std::string host;
  int port = 0;
  bool operator==(const ServiceMember& o) const {
    return name == o.name && host == o.host && port == o.port;
  }
};

// The whole current member list of one service (sent at subscribe time and after each change).
struct ServiceMembers : Message<ServiceMembers> {
  std::string service;
  std::vector<ServiceMember> members;  // distinct names, at most kMaxServiceMembers
  std::vector<std::string> known;      // every service the server knows (for "unknown service")
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// Logits of training samples `indices`, each filled as the student's loader fills that batch:
// the dataset's augmentation with these settings, seeded by aug_seed over the whole list.
struct TeacherRequest : Message<TeacherRequest> {
  uint64_t req_id = 0;
  std::vector<int64_t> indices;  // 1 .. kMaxTeacherBatch sample indices, each >= 0
  uint64_t aug_seed = 0;
  bool random_crop = false;
  int pad = 4;  // 0 .. 64
  bool flip = false;
  int top_k = 0;  // 0: every class; else the k largest logits per sample
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// The answer: rows = indices.size() rows of k values (k = classes, or top_k), row-major; with
// top_k, `classes_of` gives each value's class. A failed request carries `status` and no values.
struct TeacherReply : Message<TeacherReply> {
  uint64_t req_id = 0;
  Status status;
  int classes = 0;  // the teacher model's class count
  int rows = 0;
  int k = 0;                        // values per row
  std::vector<float> values;        // [rows, k], finite
  std::vector<int32_t> classes_of;  // [rows, k] in [0, classes); empty unless top-k
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

}  // namespace edl::proto
