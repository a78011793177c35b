// The rendezvous stores: one conformance suite over every implementation (InProcessStore,
// FileStore, TCPStore), then what is specific to FileStore: shared by forked processes and
// surviving a dead writer's partial record. TCPStore's own tests: test_tcp_store.cpp.

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/file_store.h"
#include "comm/store/in_process_store.h"
#include "comm/store/store.h"
#include "comm/store/tcp_store.h"
#include "core/error.h"
#include "store_test_support.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;
using namespace store_testing;

// ---------------------------------------------------------------------------------------
// Conformance: every store behaves the same.

// Each harness provides main() and peer(): another handle on the same store (the same object
// for InProcessStore, a second FileStore on the path, a second TCP client).
struct InProcessHarness {
  std::shared_ptr<InProcessStore> store = std::make_shared<InProcessStore>();
  std::shared_ptr<Store> main() { return store; }
  std::shared_ptr<Store> peer() { return store; }
};

struct FileHarness {
  std::string path = unique_path("loom_file_store");
  std::shared_ptr<FileStore> owner = std::make_shared<FileStore>(path, /*remove_on_exit=*/true);
  std::shared_ptr<Store> main() { return owner; }
  std::shared_ptr<Store> peer() { return std::make_shared<FileStore>(path); }
};

struct TcpHarness {
  TCPStoreServer server{"127.0.0.1", 0, kSecret};
  std::shared_ptr<Store> client = peer();
  std::shared_ptr<Store> main() { return client; }
  std::shared_ptr<Store> peer() {
    return std::make_shared<TCPStore>("127.0.0.1", server.port(), kSecret, 5s);
  }
};

template <typename Harness>
class StoreConformance : public ::testing::Test {
 protected:
  Harness harness;
  std::shared_ptr<Store> store = harness.main();
};

struct HarnessNames {
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, InProcessHarness>) return "InProcess";
    if (std::is_same_v<T, FileHarness>) return "File";
    return "TCP";
  }
};

using Harnesses = ::testing::Types<InProcessHarness, FileHarness, TcpHarness>;
TYPED_TEST_SUITE(StoreConformance, Harnesses, HarnessNames);

TYPED_TEST(StoreConformance, SetGet) {
  this->store->set("a", to_bytes("1"));
  this->store->set("b", to_bytes("two"));
  this->store->set("a", to_bytes("one"));  // overwrite
  EXPECT_EQ(to_string(this->store->get("a", 1s)), "one");
  EXPECT_EQ(to_string(this->harness.peer()->get("b", 1s)), "two");
}

TYPED_TEST(StoreConformance, EmptyAndBinaryValues) {
  const Bytes binary{0, 1, 0xff, 0, '\n', 0x80};
  this->store->set("empty", {});
  this->store->set("binary", binary);
  EXPECT_TRUE(this->store->get("empty", 1s).empty());
  EXPECT_EQ(this->store->get("binary", 1s), binary);
  const Bytes big(1 << 20, 0x5a);
  this->store->set("big", big);
  EXPECT_EQ(this->harness.peer()->get("big", 1s), big);
}

TYPED_TEST(StoreConformance, GetWaitsForALaterSet) {
  auto writer = this->harness.peer();
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    writer->set("late", to_bytes("here"));
  });
  EXPECT_EQ(to_string(this->store->get("late", 5s)), "here");
  later.join();
}

TYPED_TEST(StoreConformance, WaitReturnsWhenEveryKeyExists) {
  auto writer = this->harness.peer();
  std::thread later([&] {
    writer->set("k1", {});
    std::this_thread::sleep_for(30ms);
    writer->add("k2", 1);
  });
  this->store->wait({"k1", "k2"}, 5s);
  EXPECT_TRUE(this->store->check({"k1", "k2"}));
  later.join();
  this->store->wait({}, 0ms);  // nothing to wait for
}

TYPED_TEST(StoreConformance, GetTimesOutNamingTheKey) {
  expect_timeout([&] { this->store->get("rank/3", kShortTimeout); }, kShortTimeout,
                 {"[comm/store]", "'rank/3'", duration_str(kShortTimeout)});
  // The store still works after a timeout.
  this->store->set("rank/3", to_bytes("x"));
  EXPECT_EQ(to_string(this->store->get("rank/3", 1s)), "x");
}

TYPED_TEST(StoreConformance, WaitTimesOutNamingTheMissingKeys) {
  this->store->set("present", {});
  try {
    this->store->wait({"present", "absent/1", "absent/2"}, kShortTimeout);
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'absent/1', 'absent/2'"), std::string::npos) << what;
    EXPECT_EQ(what.find("'present'"), std::string::npos) << what;
    EXPECT_NE(what.find(duration_str(kShortTimeout)), std::string::npos) << what;
  }
  expect_timeout([&] { this->store->wait({"absent/1"}, kShortTimeout); }, kShortTimeout,
                 {"'absent/1'"});
}

TYPED_TEST(StoreConformance, AddCountsInDecimalText) {
  EXPECT_EQ(this->store->add("counter", 5), 5);
  EXPECT_EQ(this->store->add("counter", -2), 3);
  EXPECT_EQ(to_string(this->store->get("counter", 1s)), "3");
  EXPECT_EQ(this->store->add("counter", 0), 3);
  this->store->set("preset", to_bytes("-40"));
  EXPECT_EQ(this->store->add("preset", 2), -38);
}

TYPED_TEST(StoreConformance, AddFromSeveralThreadsSums) {
  constexpr int kThreads = 4;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, store = this->harness.peer()] {
      for (int i = 0; i < kAdds; ++i)
        store->add("sum", 1);
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(this->store->add("sum", 0), kThreads * kAdds);
}

TYPED_TEST(StoreConformance, AddOnANonIntegerIsMisuse) {
  this->store->set("word", to_bytes("abc"));
  try {
    this->store->add("word", 1);
    FAIL() << "expected loom::Error";
  } catch (const CommError& e) {
    FAIL() << "a non-integer is misuse, not a CommError: " << e.what();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'word'"), std::string::npos) << what;
    EXPECT_NE(what.find("'abc'"), std::string::npos) << what;
  }
  EXPECT_EQ(to_string(this->store->get("word", 1s)), "abc");  // untouched
  this->store->set("empty", {});
  EXPECT_THROW(this->store->add("empty", 1), Error);
}

TYPED_TEST(StoreConformance, CompareSet) {
  // Absent key: an empty `expected` matches and stores `desired`.
  EXPECT_EQ(to_string(this->store->compare_set("k", {}, to_bytes("first"))), "first");
  // Absent key with a non-empty `expected`: no match, returns the (empty) current value.
  EXPECT_TRUE(this->store->compare_set("absent", to_bytes("x"), to_bytes("y")).empty());
  EXPECT_FALSE(this->store->check({"absent"}));
  // Mismatch returns the current value and changes nothing.
  EXPECT_EQ(to_string(this->store->compare_set("k", to_bytes("wrong"), to_bytes("second"))),
            "first");
  EXPECT_EQ(to_string(this->store->get("k", 1s)), "first");
  // Match swaps.
  EXPECT_EQ(to_string(this->store->compare_set("k", to_bytes("first"), to_bytes("second"))),
            "second");
  EXPECT_EQ(to_string(this->harness.peer()->get("k", 1s)), "second");
}

TYPED_TEST(StoreConformance, CompareSetWakesWaiters) {
  auto writer = this->harness.peer();
  std::thread later([&] {
    std::this_thread::sleep_for(30ms);
    writer->compare_set("cas", {}, to_bytes("v"));
  });
  EXPECT_EQ(to_string(this->store->get("cas", 5s)), "v");
  later.join();
}

TYPED_TEST(StoreConformance, CheckAndRemove) {
  EXPECT_TRUE(this->store->check({}));
  EXPECT_FALSE(this->store->check({"x"}));
  this->store->set("x", to_bytes("1"));
  this->store->set("y", to_bytes("2"));
  EXPECT_TRUE(this->store->check({"x", "y"}));
  EXPECT_FALSE(this->store->check({"x", "z"}));
  EXPECT_TRUE(this->store->remove("x"));
  EXPECT_FALSE(this->store->remove("x"));
  EXPECT_FALSE(this->harness.peer()->check({"x"}));
  EXPECT_TRUE(this->store->check({"y"}));
  expect_timeout([&] { this->store->get("x", kShortTimeout); }, kShortTimeout, {"'x'"});
}

TYPED_TEST(StoreConformance, PrefixStoresAreIsolated) {
  PrefixStore a("group_a", this->store);
  PrefixStore b("group_b", this->harness.peer());
  a.set("key", to_bytes("from a"));
  b.set("key", to_bytes("from b"));
  EXPECT_EQ(to_string(a.get("key", 1s)), "from a");
  EXPECT_EQ(to_string(b.get("key", 1s)), "from b");
  EXPECT_EQ(to_string(this->store->get("group_a/key", 1s)), "from a");
  EXPECT_FALSE(this->store->check({"key"}));
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 5);
  EXPECT_TRUE(a.check({"key", "n"}));
  EXPECT_EQ(to_string(a.compare_set("key", to_bytes("from a"), to_bytes("a2"))), "a2");
  EXPECT_TRUE(a.remove("key"));
  EXPECT_FALSE(a.check({"key"}));
  EXPECT_TRUE(b.check({"key"}));
  b.wait({"key", "n"}, 1s);
  expect_timeout([&] { a.wait({"key"}, kShortTimeout); }, kShortTimeout, {"'group_a/key'"});
}

// ---------------------------------------------------------------------------------------
// FileStore

TEST(FileStore, CreatesItsFileWithMode0600AndRemovesItOnExit) {
  const std::string path = unique_path("loom_file_mode");
  {
    FileStore store(path, /*remove_on_exit=*/true);
    store.set("k", to_bytes("v"));
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(store.path(), path);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  {
    FileStore keep(path);
    keep.set("k", {});
  }
  EXPECT_TRUE(std::filesystem::exists(path));
  std::filesystem::remove(path);
}

TEST(FileStore, SharedByForkedProcesses) {
  const std::string path = unique_path("loom_file_fork");
  FileStore parent(path, /*remove_on_exit=*/true);
  constexpr int kChildren = 4;
  constexpr int kAdds = 40;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    children.push_back(spawn([&, c] {
      FileStore store(path);
      for (int i = 0; i < kAdds; ++i)
        store.add("counter", 1);
      store.set("child/" + std::to_string(c), to_bytes(std::to_string(c * 10)));
      // Every child waits for the value the parent publishes after seeing all of them.
      return to_string(store.get("go", 10s)) == "go" ? 0 : 4;
    }));
  }
  std::vector<std::string> keys;
  for (int c = 0; c < kChildren; ++c)
    keys.push_back("child/" + std::to_string(c));
  parent.wait(keys, 10s);
  EXPECT_EQ(parent.add("counter", 0), kChildren * kAdds);
  EXPECT_EQ(to_string(parent.get("child/3", 1s)), "30");
  parent.set("go", to_bytes("go"));
  for (pid_t pid : children)
    EXPECT_EQ(join(pid), 0);
}

TEST(FileStore, ForkedChildUsesTheParentsObject) {
  const std::string path = unique_path("loom_file_inherit");
  FileStore store(path, /*remove_on_exit=*/true);
  store.set("before", to_bytes("fork"));
  const pid_t child = spawn([&] {
    if (to_string(store.get("before", 1s)) != "fork") return 4;
    store.add("n", 1);
    return 0;  // _exit: the child's copy never removes the file
  });
  EXPECT_EQ(join(child), 0);
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(store.add("n", 1), 2);
}

TEST(FileStore, ReaderSkipsAndWriterRepairsADeadWritersPartialRecord) {
  const std::string path = unique_path("loom_file_partial");
  FileStore store(path, /*remove_on_exit=*/true);
  store.set("whole", to_bytes("ok"));
  {
    // A set record cut short: kind 'S', key length 4, value length 100, then only "ke".
    const unsigned char partial[] = {'S', 4, 0, 0, 0, 100, 0, 0, 0, 'k', 'e'};
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, partial, sizeof(partial)), ssize_t(sizeof(partial)));
    ::close(fd);
  }
  FileStore other(path);
  EXPECT_EQ(to_string(other.get("whole", 1s)), "ok");
  EXPECT_FALSE(other.check({"keys"}));
  other.set("after", to_bytes("repaired"));
  FileStore third(path);
  EXPECT_EQ(to_string(third.get("after", 1s)), "repaired");
  EXPECT_EQ(to_string(third.get("whole", 1s)), "ok");
  EXPECT_EQ(to_string(store.get("after", 1s)), "repaired");
}

TEST(FileStore, RejectsAFileThatIsNotAStore) {
  const std::string path = unique_path("loom_file_foreign");
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("some other program's data\n", f);
    std::fclose(f);
  }
  try {
    FileStore store(path);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(FileStore, UnreachablePathIsACommErrorNamingIt) {
  try {
    FileStore store("/nonexistent_dir_for_loom/store");
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent_dir_for_loom/store"), std::string::npos);
  }
}

}  // namespace
}  // namespace loom::comm
