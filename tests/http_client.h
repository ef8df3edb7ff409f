// A bounded HTTP/1.1 client for tests of `edl server --http_addr` (Boost.Beast): one request per
// call, every wait bounded by a timeout, failures returned as text rather than thrown; and a raw
// exchange for hostile requests (bytes out, whatever comes back until the server closes).
//
// Thread-safety: each call uses its own io_context; calls may run on any thread.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace edl::test {

struct HttpReply {
  int status = 0;  // 0: no answer (see error)
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string error;
};

inline HttpReply HttpGet(const std::string& host, int port, const std::string& target,
                         const std::map<std::string, std::string>& headers = {},
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(15000)) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, host + ":" + std::to_string(port));
  for (const auto& [k, v] : headers) req.set(k, v);
  http::response_parser<http::string_body> parser;
  parser.body_limit(64u << 20);
  HttpReply out;
  stream.expires_after(timeout);
  const boost::asio::ip::tcp::endpoint ep(boost::asio::ip::make_address(host),
                                          static_cast<uint16_t>(port));
  stream.async_connect(ep, [&](beast::error_code ec) {
    if (ec) {
      out.error = "connect: " + ec.message();
      return;
    }
    http::async_write(stream, req, [&](beast::error_code ec, size_t) {
      if (ec) {
        out.error = "write: " + ec.message();
        return;
      }
      http::async_read(stream, buffer, parser, [&](beast::error_code ec, size_t) {
        if (ec) {
          out.error = "read: " + ec.message();
          return;
        }
        const auto& res = parser.get();
        out.status = static_cast<int>(res.result_int());
        out.body = res.body();
        for (const auto& f : res) {
          std::string name(f.name_string());
          for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          out.headers[name] = std::string(f.value());
        }
      });
    });
  });
  io.run();  // bounded by the stream's expiry
  return out;
}

// Sends `bytes` to 127.0.0.1:`port` (after `gap` between each of `chunks` equal pieces, when
// given) and returns whatever comes back until the server closes or `timeout` passes; *closed
// says whether the server closed the connection.
inline std::string RawExchange(
    int port, const std::string& bytes, bool* closed,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(15000)) {
  namespace beast = boost::beast;
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  std::string got;
  *closed = false;
  char buf[4096];
  stream.expires_after(timeout);
  std::function<void()> read_more = [&] {
    stream.async_read_some(boost::asio::buffer(buf), [&](beast::error_code ec, size_t n) {
      got.append(buf, n);
      if (ec) {
        *closed = ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset;
        return;
      }
      read_more();
    });
  };
  const boost::asio::ip::tcp::endpoint ep(boost::asio::ip::make_address("127.0.0.1"),
                                          static_cast<uint16_t>(port));
  stream.async_connect(ep, [&](beast::error_code ec) {
    if (ec) return;
    boost::asio::async_write(stream, boost::asio::buffer(bytes), [&](beast::error_code ec, size_t) {
      if (!ec) read_more();
    });
  });
  io.run();
  return got;
}

}  // namespace edl::test
