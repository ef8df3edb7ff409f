#include "jobserver/http/http_request.h"

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>

namespace edl::jobserver {

namespace beast = boost::beast;
namespace http = boost::beast::http;

namespace {

bool NameOrValueByte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    const char y = b[i] >= 'A' && b[i] <= 'Z' ? static_cast<char>(b[i] - 'A' + 'a') : b[i];
    if (x != y) return false;
  }
  return true;
}

}  // namespace

int HttpStatusOf(HttpRefusal r) {
  switch (r) {
    case HttpRefusal::kNone:
      return 200;
    case HttpRefusal::kBadRequest:
      return 400;
    case HttpRefusal::kHeadTooLarge:
      return 431;
    case HttpRefusal::kTargetTooLong:
      return 414;
    case HttpRefusal::kBodyNotAllowed:
      return 413;
  }
  return 400;
}

HttpRequestParser::HttpRequestParser(const HttpLimits& limits) : limits_(limits) {
  header_limit(static_cast<std::uint32_t>(limits_.max_head_bytes));
  body_limit(0);  // read-only: a request with a body is refused before any of it is read
  eager(false);
}

void HttpRequestParser::Refuse(HttpRefusal r, boost::system::error_code& ec) {
  refusal_ = r;
  ec = http::error::bad_value;  // stops the parser; refusal_ says what to answer
}

HttpRefusal HttpRequestParser::RefusalOf(const boost::system::error_code& ec) const {
  if (refusal_ != HttpRefusal::kNone) return refusal_;
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    return HttpRefusal::kHeadTooLarge;
  }
  if (ec == http::error::body_limit) return HttpRefusal::kBodyNotAllowed;
  return HttpRefusal::kBadRequest;
}

void HttpRequestParser::on_request_impl(http::verb method, beast::string_view method_str,
                                        beast::string_view target, int version,
                                        boost::system::error_code& ec) {
  if (version != 10 && version != 11) return Refuse(HttpRefusal::kBadRequest, ec);
  if (target.size() > limits_.max_target_bytes) return Refuse(HttpRefusal::kTargetTooLong, ec);
  if (target.empty() || target[0] != '/')
    return Refuse(HttpRefusal::kBadRequest, ec);  // origin-form
  head_.method = method == http::verb::get    ? HttpMethod::kGet
                 : method == http::verb::head ? HttpMethod::kHead
                                              : HttpMethod::kOther;
  const std::string_view t(target.data(), target.size());
  const size_t q = t.find('?');
  head_.path = std::string(t.substr(0, q));
  head_.query = q == std::string_view::npos ? "" : std::string(t.substr(q + 1));
}

void HttpRequestParser::on_response_impl(int, beast::string_view, int,
                                         boost::system::error_code& ec) {
  Refuse(HttpRefusal::kBadRequest, ec);  // never called on a request parser
}

void HttpRequestParser::on_field_impl(http::field name, beast::string_view name_string,
                                      beast::string_view value, boost::system::error_code& ec) {
  if (++head_.fields > limits_.max_fields) return Refuse(HttpRefusal::kHeadTooLarge, ec);
  const std::string_view v(value.data(), value.size());
  if (name == http::field::host) {
    if (host_seen_) return Refuse(HttpRefusal::kBadRequest, ec);  // RFC 7230 5.4
    host_seen_ = true;
    head_.host = std::string(v);
  } else if (name == http::field::authorization) {
    if (head_.has_authorization) return Refuse(HttpRefusal::kBadRequest, ec);
    head_.has_authorization = true;
    constexpr std::string_view kScheme = "bearer ";
    if (v.size() > kScheme.size() && IEquals(v.substr(0, kScheme.size()), kScheme)) {
      std::string_view cred = v.substr(kScheme.size());
      while (!cred.empty() && cred.front() == ' ') cred.remove_prefix(1);
      head_.bearer = std::string(cred);
    }
  }
}

void HttpRequestParser::on_header_impl(boost::system::error_code& ec) {
  // Beast refuses a Content-Length over body_limit (0) itself; a chunked body is refused here,
  // before its first byte is read.
  if (chunked() || (content_length() && *content_length() > 0)) {
    return Refuse(HttpRefusal::kBodyNotAllowed, ec);
  }
}

void HttpRequestParser::on_body_init_impl(const boost::optional<std::uint64_t>&,
                                          boost::system::error_code& ec) {
  Refuse(HttpRefusal::kBodyNotAllowed, ec);
}

std::size_t HttpRequestParser::on_body_impl(beast::string_view, boost::system::error_code& ec) {
  Refuse(HttpRefusal::kBodyNotAllowed, ec);
  return 0;
}

void HttpRequestParser::on_chunk_header_impl(std::uint64_t, beast::string_view,
                                             boost::system::error_code& ec) {
  Refuse(HttpRefusal::kBodyNotAllowed, ec);
}

std::size_t HttpRequestParser::on_chunk_body_impl(std::uint64_t, beast::string_view,
                                                  boost::system::error_code& ec) {
  Refuse(HttpRefusal::kBodyNotAllowed, ec);
  return 0;
}

void HttpRequestParser::on_finish_impl(boost::system::error_code&) {}

HttpRefusal ParseHttpRequestHead(std::string_view bytes, const HttpLimits& limits,
                                 HttpRequestHead* head, size_t* consumed) {
  HttpRequestParser p(limits);
  size_t used = 0;
  // The whole head must be in `bytes`: Beast consumes a head only once its end is there.
  while (!p.is_done()) {
    boost::system::error_code ec;
    const size_t n = p.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) {
      if (n == 0) return HttpRefusal::kBadRequest;  // it ends before the head does
      continue;
    }
    if (ec) return p.RefusalOf(ec);
  }
  *head = p.head();
  *consumed = used;
  return HttpRefusal::kNone;
}

bool ParseHttpQuery(std::string_view query, int max_params,
                    std::map<std::string, std::string>* out) {
  out->clear();
  if (query.empty()) return true;
  int n = 0;
  while (true) {
    const size_t amp = query.find('&');
    const std::string_view part = query.substr(0, amp);
    if (++n > max_params) return false;
    const size_t eq = part.find('=');
    const std::string_view name = part.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : part.substr(eq + 1);
    if (name.empty()) return false;
    for (char c : name) {
      if (!NameOrValueByte(c)) return false;
    }
    for (char c : value) {
      if (!NameOrValueByte(c)) return false;
    }
    if (!out->emplace(std::string(name), std::string(value)).second) return false;
    if (amp == std::string_view::npos) return true;
    query.remove_prefix(amp + 1);
  }
}

}  // namespace edl::jobserver
