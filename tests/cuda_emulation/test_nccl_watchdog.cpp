// The NCCL backend's watchdog and abort paths without a GPU: comm/nccl/communicator.cpp and
// the event poll of comm/cuda/event_wait.h, against a scriptable fake of libnccl
// (fake_nccl.h) and a fake event. What the backend does around them (events on the caller's
// and comm streams, record_stream) needs a device and is not covered here (docs/cuda.md).

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "comm/cuda/event_wait.h"
#include "comm/error.h"
#include "comm/nccl/communicator.h"
#include "fake_nccl.h"

namespace loom::comm::nccl {
namespace {

using namespace std::chrono_literals;

Deadline soon() { return deadline_after(std::chrono::duration_cast<Duration>(100ms)); }
Deadline later() { return deadline_after(std::chrono::duration_cast<Duration>(30s)); }

template <typename F>
std::string comm_error_of(F&& f) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CommError";
  return "";
}

class NcclWatchdog : public ::testing::Test {
 protected:
  void SetUp() override { fake_nccl::reset({}); }
  void TearDown() override {
    EXPECT_EQ(fake_nccl::counts().alive(), 0) << "a communicator was neither destroyed nor aborted";
  }
  static Communicator make() {
    return Communicator::create(ncclUniqueId{}, 1, 2, later(), "[comm/nccl] rank 1 (group g)");
  }
};

TEST_F(NcclWatchdog, CreationSettlesOnceEveryRankJoinedAndClosesCleanly) {
  {
    Communicator c = make();
    EXPECT_TRUE(c.valid());
    EXPECT_EQ(fake_nccl::counts().polls, 4);  // three in progress, then success
  }
  EXPECT_EQ(fake_nccl::counts().finalized, 1);
  EXPECT_EQ(fake_nccl::counts().destroyed, 1);
  EXPECT_EQ(fake_nccl::counts().aborted, 0);
}

TEST_F(NcclWatchdog, ACreationThatNeverFinishesIsAbortedAtItsDeadline) {
  fake_nccl::script().forever_in_progress = true;
  const std::string what = comm_error_of(
      [] { Communicator::create(ncclUniqueId{}, 0, 2, soon(), "[comm/nccl] rank 0 (group g)"); });
  EXPECT_NE(what.find("[comm/nccl] rank 0 (group g): creating the communicator"), std::string::npos) << what;
  EXPECT_NE(what.find("did not finish by its deadline"), std::string::npos) << what;
  EXPECT_NE(what.find("create a new one"), std::string::npos) << what;
  EXPECT_EQ(fake_nccl::counts().aborted, 1);
}

TEST_F(NcclWatchdog, AnAsynchronousErrorAbortsAndNamesNcclsReason) {
  Communicator c = make();
  fake_nccl::script().settled = ncclRemoteError;
  fake_nccl::script().last_error = "peer 0 closed the connection";
  const std::string what = comm_error_of([&] { c.check_async("allreduce"); });
  EXPECT_NE(what.find("allreduce failed: remote process exited"), std::string::npos) << what;
  EXPECT_NE(what.find("(NCCL: peer 0 closed the connection)"), std::string::npos) << what;
  EXPECT_TRUE(c.aborted());
  EXPECT_FALSE(c.valid());
  c.abort();  // idempotent
  EXPECT_EQ(fake_nccl::counts().aborted, 1);
  EXPECT_EQ(fake_nccl::counts().finalized, 0) << "a broken communicator is aborted, not finalized";
}

TEST_F(NcclWatchdog, AnEnqueueStillInProgressAtTheDeadlineIsAborted) {
  Communicator c = make();
  fake_nccl::script().forever_in_progress = true;
  const std::string what = comm_error_of([&] { c.settle(ncclInProgress, soon(), "all_gather"); });
  EXPECT_NE(what.find("all_gather did not finish by its deadline"), std::string::npos) << what;
  EXPECT_TRUE(c.aborted());
}

TEST_F(NcclWatchdog, MisuseIsAnErrorNotAPeerFailure) {
  fake_nccl::script().issue = ncclInvalidArgument;
  try {
    make();
    FAIL() << "expected loom::Error";
  } catch (const CommError& e) {
    FAIL() << "misuse reported as a peer failure: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid argument"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fake_nccl::counts().aborted, 1) << "what NCCL left behind is aborted";
}

TEST_F(NcclWatchdog, AFinalizeThatNeverFlushesIsAbortedAtTheCloseDeadline) {
  Communicator c = make();
  fake_nccl::script().forever_in_progress = true;
  c.close(soon());
  EXPECT_EQ(fake_nccl::counts().finalized, 1);
  EXPECT_EQ(fake_nccl::counts().aborted, 1);
  EXPECT_EQ(fake_nccl::counts().destroyed, 0);
}

TEST_F(NcclWatchdog, MovingHandsOverOwnershipAndAssignmentClosesTheOld) {
  Communicator a = make();
  Communicator b = std::move(a);
  EXPECT_FALSE(a.valid());
  EXPECT_TRUE(b.valid());
  b = make();  // the first one is closed here
  EXPECT_EQ(fake_nccl::counts().destroyed, 1);
}

TEST_F(NcclWatchdog, SplitSettlesParentAndChildAndMayYieldNone) {
  Communicator parent = make();
  Communicator child = parent.split(0, 1, later(), "child");
  EXPECT_TRUE(child.valid());
  fake_nccl::script().split_gives_none = true;
  Communicator none = parent.split(-1, 0, later(), "none");
  EXPECT_FALSE(none.valid());
}

// A fake event: done after `ready_after` queries (never when negative).
struct FakeEvent {
  int ready_after;
  mutable int queries = 0;
  bool query() const { return ++queries > ready_after && ready_after >= 0; }
};

TEST(EventWatchdog, ReturnsWhenTheDeviceFinished) {
  FakeEvent event{100};
  EXPECT_TRUE(wait_event(event, deadline_after(std::chrono::duration_cast<Duration>(30s))));
  EXPECT_EQ(event.queries, 101);
}

TEST(EventWatchdog, GivesUpAtTheDeadline) {
  FakeEvent never{-1};
  EXPECT_FALSE(wait_event(never, soon()));
}

TEST(EventWatchdog, ChecksTheCommunicatorWhileWaitingAndStopsOnItsError) {
  fake_nccl::reset({});
  Communicator c = Communicator::create(ncclUniqueId{}, 0, 2, later(), "w");
  fake_nccl::script().settled = ncclSystemError;
  FakeEvent never{-1};
  const std::string what = comm_error_of(
      [&] { wait_event(never, later(), [&] { c.check_async("broadcast"); }); });
  EXPECT_NE(what.find("broadcast failed"), std::string::npos) << what;
  EXPECT_LT(never.queries, 1000) << "the error should end the wait at the next check";
  EXPECT_TRUE(c.aborted());
}

}  // namespace
}  // namespace loom::comm::nccl
