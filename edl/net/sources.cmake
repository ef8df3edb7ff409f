# edl/net: HMAC auth and session MACs, admission control, blocking and Asio framed connections,
# the trainer channel.
list(APPEND EDL_SOURCES
  net/admission.cc
  net/auth.cc
  net/framed_socket.cc
  net/handshake.cc
  net/connection.cc
  net/trainer_channel.cc
)
