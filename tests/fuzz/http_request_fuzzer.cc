// The request head of `edl server --http_addr` (jobserver/http/http_request.h): arbitrary bytes as
// an unauthenticated peer sends them, whole and split in two as they may arrive on a socket; and,
// for inputs that are JSON, an events-log record fed to ServerMetrics (a trainer event's fields
// come from a node) and the Prometheus text rendered from it. Whatever the bytes: a refusal or a
// head within HttpLimits, never a crash; the same answer whole or split.
#include <string>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>

#include "jobserver/http/http_request.h"
#include "jobserver/http/metrics.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edl::jobserver;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  HttpLimits limits;
  limits.max_head_bytes = 1024;  // small enough for the fuzzer's inputs to reach it
  limits.max_fields = 8;
  limits.max_target_bytes = 128;
  HttpRequestHead head;
  size_t consumed = 0;
  const HttpRefusal r = ParseHttpRequestHead(bytes, limits, &head, &consumed);
  if (r == HttpRefusal::kNone) {
    FUZZ_CHECK(consumed <= size && consumed <= limits.max_head_bytes);
    FUZZ_CHECK(!head.path.empty() && head.path[0] == '/');
    FUZZ_CHECK(head.path.size() + head.query.size() <= limits.max_target_bytes);
    FUZZ_CHECK(head.fields <= limits.max_fields);
    std::map<std::string, std::string> q;
    if (ParseHttpQuery(head.query, limits.max_query_params, &q)) {
      FUZZ_CHECK(q.size() <= static_cast<size_t>(limits.max_query_params));
    }
  } else {
    const int status = HttpStatusOf(r);
    FUZZ_CHECK(status >= 400 && status < 500);
  }
  // Split at a point chosen by the input: the parser sees the bytes as two reads.
  if (size > 1) {
    HttpRequestParser p(limits);
    const size_t cut = data[0] % size;
    boost::system::error_code ec;
    size_t used = p.put(boost::asio::buffer(bytes.data(), cut), ec);
    if (!ec || ec == boost::beast::http::error::need_more) {
      ec = {};
      while (!p.is_done() && used < size) {
        const size_t n = p.put(boost::asio::buffer(bytes.data() + used, size - used), ec);
        used += n;
        if (ec || n == 0) break;
      }
    }
    // The head is parsed once it is all there; a split cannot turn a refusal into an acceptance
    // of a different head.
    if (p.is_done() && r == HttpRefusal::kNone) FUZZ_CHECK(p.head().path == head.path);
  }
  if (size > 0 && data[0] == '{') {
    const nlohmann::json rec = nlohmann::json::parse(bytes, nullptr, false);
    if (!rec.is_discarded()) {
      edl::ManualClock clock;
      ServerMetrics m(&clock);
      m.OnRecord(rec);
      m.OnRecord(rec);
      const std::string text = m.Render(rec);
      FUZZ_CHECK(text.find("edl_server_uptime_seconds") != std::string::npos);
      const std::string job = rec.is_object() && rec.contains("job") && rec["job"].is_string()
                                  ? rec["job"].get<std::string>()
                                  : "j";
      FUZZ_CHECK(nlohmann::json::parse(m.Recent(job, 0), nullptr, false).is_object());
    }
  }
  return 0;
}
