// The HTTP request head of `edl server --http_addr` (jobserver/http/http_endpoint.h): a bounded
// parser over Boost.Beast's basic_parser that keeps only what the endpoint acts on (method, path,
// query, Host, a bearer token) and refuses anything else a read-only endpoint has no use for: a
// body, more than HttpLimits' header fields or bytes, a long target, HTTP/0.9 or 2. Every byte here
// comes from an unauthenticated peer; a refusal names an HTTP status and nothing of the input.
//
// Thread-safety: none; one parser per connection, on the server's io_context thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include <boost/beast/http/basic_parser.hpp>

namespace edl::jobserver {

struct HttpLimits {
  size_t max_head_bytes = 8192;    // request line and header fields together
  size_t max_target_bytes = 1024;  // path and query
  int max_fields = 48;             // header fields
  int max_query_params = 8;
};

enum class HttpMethod { kGet, kHead, kOther };

// What the endpoint needs from one request.
struct HttpRequestHead {
  HttpMethod method = HttpMethod::kOther;
  std::string path;    // the target before '?', as sent (never decoded: routes match it exactly)
  std::string query;   // after '?'
  std::string host;    // the Host field ("" when absent)
  std::string bearer;  // the credentials of "Authorization: Bearer ..." ("" when absent)
  bool has_authorization = false;  // an Authorization field of any scheme
  int fields = 0;
};

// A request the parser refuses, with the status the endpoint answers (then it closes).
enum class HttpRefusal {
  kNone,
  kBadRequest,      // 400: not HTTP/1.x, a malformed line or field, a repeated Host
  kHeadTooLarge,    // 431: over max_head_bytes or max_fields
  kTargetTooLong,   // 414
  kBodyNotAllowed,  // 413: a Content-Length > 0 or chunked body on a read-only endpoint
};
int HttpStatusOf(HttpRefusal r);

class HttpRequestParser : public boost::beast::http::basic_parser<true> {
 public:
  explicit HttpRequestParser(const HttpLimits& limits);

  const HttpRequestHead& head() const { return head_; }
  // Set when the parser stopped on a bound or a malformed request (then put() has failed);
  // kBadRequest for Beast's own syntax errors is left to the caller (RefusalOf).
  HttpRefusal refusal() const { return refusal_; }
  // The refusal for a failed put()/read: the parser's own, else the bound Beast enforced, else
  // kBadRequest.
  HttpRefusal RefusalOf(const boost::system::error_code& ec) const;

 private:
  void on_request_impl(boost::beast::http::verb method, boost::beast::string_view method_str,
                       boost::beast::string_view target, int version,
                       boost::system::error_code& ec) override;
  void on_response_impl(int code, boost::beast::string_view reason, int version,
                        boost::system::error_code& ec) override;
  void on_field_impl(boost::beast::http::field name, boost::beast::string_view name_string,
                     boost::beast::string_view value, boost::system::error_code& ec) override;
  void on_header_impl(boost::system::error_code& ec) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                         boost::system::error_code& ec) override;
  std::size_t on_body_impl(boost::beast::string_view body, boost::system::error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t size, boost::beast::string_view extensions,
                            boost::system::error_code& ec) override;
  std::size_t on_chunk_body_impl(std::uint64_t remain, boost::beast::string_view body,
                                 boost::system::error_code& ec) override;
  void on_finish_impl(boost::system::error_code& ec) override;

  void Refuse(HttpRefusal r, boost::system::error_code& ec);

  const HttpLimits limits_;
  HttpRequestHead head_;
  HttpRefusal refusal_ = HttpRefusal::kNone;
  bool host_seen_ = false;
};

// Parses a whole request head held in `bytes` (the fuzz harness and the tests; the endpoint reads
// from its socket with the same parser). Returns kNone and fills *head when `bytes` begins with a
// complete, acceptable head (*consumed: its length); kBadRequest when `bytes` ends first.
HttpRefusal ParseHttpRequestHead(std::string_view bytes, const HttpLimits& limits,
                                 HttpRequestHead* head, size_t* consumed);

// "a=1&b=x" -> {a: 1, b: x}. False (the request is a 400) on more than `max_params` parameters, a
// repeated or empty name, or a byte outside [A-Za-z0-9._-] in a name or value: the endpoint's
// parameters are job names and numbers, so nothing needs decoding.
bool ParseHttpQuery(std::string_view query, int max_params,
                    std::map<std::string, std::string>* out);

}  // namespace edl::jobserver
