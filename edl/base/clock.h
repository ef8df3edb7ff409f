// Clock: the time source behind every timeout and scaling schedule, behind an interface so tests
// can drive time by hand (leveldb Env::NowMicros). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace edl {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time in microseconds since an arbitrary epoch.
  virtual int64_t NowMicros() const = 0;
  // Wall-clock time in microseconds since the Unix epoch (for logs and events).
  virtual int64_t WallMicros() const = 0;

  // The process-wide real clock. Never null; not owned by the caller.
  static Clock* Real();
};

// A clock tests advance by hand. Both readings start at `start_micros`.
class ManualClock : public Clock {
 public:
  explicit ManualClock(int64_t start_micros = 1'000'000) : now_(start_micros) {}
  int64_t NowMicros() const override { return now_.load(); }
  int64_t WallMicros() const override { return now_.load(); }
  void Advance(int64_t micros) { now_ += micros; }

 private:
  std::atomic<int64_t> now_;
};

// Seconds as a double between two NowMicros() readings.
inline double MicrosToSeconds(int64_t micros) { return static_cast<double>(micros) * 1e-6; }

}  // namespace edl
