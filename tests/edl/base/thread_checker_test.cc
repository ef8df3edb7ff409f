#include "edl/base/thread_checker.h"

#include <gtest/gtest.h>

#include <thread>

namespace edl {
namespace {

// Runs `fn` on a thread of its own and returns its result.
template <typename Fn>
bool OnOtherThread(Fn fn) {
  bool result = false;
  std::thread t([&] { result = fn(); });
  t.join();
  return result;
}

TEST(ThreadCheckerTest, FirstCheckingThreadOwnsIt) {
  ThreadChecker checker;
  EXPECT_TRUE(checker.CalledOnOwningThread());
  EXPECT_TRUE(checker.CalledOnOwningThread());
  EXPECT_FALSE(OnOtherThread([&] { return checker.CalledOnOwningThread(); }));
  EXPECT_TRUE(checker.CalledOnOwningThread());  // a refused thread does not take it over
}

TEST(ThreadCheckerTest, OwnedByTheThreadThatChecksFirst) {
  ThreadChecker checker;
  EXPECT_TRUE(OnOtherThread([&] { return checker.CalledOnOwningThread(); }));
  EXPECT_FALSE(checker.CalledOnOwningThread());
}

TEST(ThreadCheckerTest, DetachHandsItToTheNextThread) {
  ThreadChecker checker;
  EXPECT_TRUE(checker.CalledOnOwningThread());
  checker.Detach();
  EXPECT_TRUE(OnOtherThread([&] { return checker.CalledOnOwningThread(); }));
  EXPECT_FALSE(checker.CalledOnOwningThread());
}

TEST(ThreadCheckerTest, DcheckFailsOffTheOwningThread) {
  ThreadChecker checker;
  ASSERT_TRUE(checker.CalledOnOwningThread());
  auto elsewhere = [&] { std::thread([&] { EDL_DCHECK_OWNING_THREAD(checker); }).join(); };
#ifdef NDEBUG
  elsewhere();  // compiled out (the sanitizer trees, built without NDEBUG, check the death)
#else
  EXPECT_DEATH(elsewhere(), "called off the one thread this object runs on");
#endif
  EDL_DCHECK_OWNING_THREAD(checker);
  EXPECT_TRUE(checker.CalledOnOwningThread());
}

}  // namespace
}  // namespace edl
