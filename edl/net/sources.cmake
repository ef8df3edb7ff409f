# edl/net: HMAC auth, blocking and Asio framed connections, the trainer channel.
list(APPEND EDL_SOURCES
  net/auth.cc
  net/framed_socket.cc
  net/connection.cc
  net/trainer_channel.cc
)
