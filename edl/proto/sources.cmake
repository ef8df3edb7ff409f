# edl/proto: wire frames and control-plane messages (included by edl/CMakeLists.txt).
list(APPEND EDL_SOURCES
  proto/frame.cc
  proto/frames.cc
  proto/messages.cc
  proto/names.cc
  proto/service_messages.cc
  proto/trainer_events.cc
)
