// The NVMe extent store: allocation over swap files, checksummed round
// trips, injected device faults, and ownership of the swap directory. Runs
// on the default aio backend and again under STRATA_AIO_BACKEND=threads.
#include "src/tier/nvme_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/testutil/testutil.h"

namespace strata::tier {
namespace {

namespace fs = std::filesystem;
using testutil::FillRandom;
using testutil::ScratchDir;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kKiB = 1 << 10;

// Forwards to the injector a test arms, so one engine serves the setup
// writes unharmed and then the faulty transfers.
class SwitchInjector : public aio::FaultInjector {
 public:
  void Arm(aio::FaultInjector* target) { target_.store(target); }
  uint32_t SubmitLength(bool write, uint64_t offset, uint32_t len) override {
    aio::FaultInjector* t = target_.load();
    return t ? t->SubmitLength(write, offset, len) : len;
  }
  int CompletionResult(bool write, uint64_t offset, uint32_t len,
                       int result) override {
    aio::FaultInjector* t = target_.load();
    return t ? t->CompletionResult(write, offset, len, result) : result;
  }
  void AfterRead(uint64_t offset, char* data, uint32_t bytes) override {
    if (aio::FaultInjector* t = target_.load())
      t->AfterRead(offset, data, bytes);
  }

 private:
  std::atomic<aio::FaultInjector*> target_{nullptr};
};

aio::PinnedBuffer Buffer(size_t bytes) {
  aio::PinOptions po;
  po.lock = false;  // the memlock limit is not what these tests are about
  auto b = aio::PinnedBuffer::Allocate(bytes, po);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(*b);
}

class NvmeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    aio::IoOptions eo;
    eo.block_size = 64 * kKiB;  // split extents so pieces run in parallel
    eo.fault_injector = &faults_;
    auto e = aio::Engine::Open(eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
  }

  std::unique_ptr<NvmeStore> Open(uint64_t capacity, int files,
                                  const std::string& dir = "") {
    NvmeStoreOptions o;
    o.dir = dir.empty() ? dir_.path() : dir;
    o.capacity = capacity;
    o.files = files;
    auto s = NvmeStore::Open(engine_.get(), o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  Extent Alloc(NvmeStore& s, uint64_t bytes) {
    auto e = s.Allocate(bytes);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? *e : Extent{};
  }

  // A one-file store holding one extent of random bytes, written and
  // recorded: where the fault tests start. `store` is null on failure.
  struct Written {
    std::unique_ptr<NvmeStore> store;
    Extent extent;
    aio::PinnedBuffer out;  // what the extent holds
    aio::PinnedBuffer in;   // room to read it back
  };
  Written WriteOne(uint64_t bytes, uint64_t seed) {
    Written w;
    auto store = Open(kMiB, 1);
    if (!store) return w;
    w.extent = Alloc(*store, bytes);
    w.out = Buffer(w.extent.bytes);
    w.in = Buffer(w.extent.bytes);
    FillRandom(w.out.data(), w.extent.bytes, seed);
    const Status st = store->Write(w.extent, w.out.data());
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (st.ok()) w.store = std::move(store);
    return w;
  }

  ScratchDir dir_;
  SwitchInjector faults_;
  std::unique_ptr<aio::Engine> engine_;
};

TEST_F(NvmeStoreTest, RoundTripsRandomDataInManyExtentsAcrossFiles) {
  auto store = Open(8 * kMiB, 4);
  ASSERT_TRUE(store);
  ASSERT_GE(store->alignment(), 4096u);
  EXPECT_EQ(store->stats().capacity, 8 * kMiB);
  std::vector<Extent> extents;
  std::vector<aio::PinnedBuffer> out, in;
  std::set<int> files;
  uint64_t total = 0;
  for (int i = 0; i < 24; ++i) {
    const uint64_t bytes = (1 + i % 5) * 40 * kKiB + 1;  // rounds up
    extents.push_back(Alloc(*store, bytes));
    const Extent& e = extents.back();
    ASSERT_TRUE(e.valid());
    EXPECT_EQ(e.file, i % 4) << "allocations rotate over the files";
    EXPECT_GE(e.bytes, bytes);
    EXPECT_EQ(e.bytes % store->alignment(), 0u);
    EXPECT_EQ(e.offset % store->alignment(), 0u);
    files.insert(e.file);
    total += e.bytes;
    out.push_back(Buffer(e.bytes));
    in.push_back(Buffer(e.bytes));
    FillRandom(out.back().data(), e.bytes, 100 + i);
  }
  EXPECT_EQ(files.size(), 4u);
  std::vector<PendingIo> writes;
  for (size_t i = 0; i < extents.size(); ++i) {
    auto io = store->StartWrite(extents[i], out[i].data());
    ASSERT_TRUE(io.ok()) << io.status().ToString();
    writes.push_back(std::move(*io));
  }
  for (PendingIo& io : writes) {
    const Status st = store->FinishIo(io);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  for (size_t i = 0; i < extents.size(); ++i) {
    const Status st = store->Read(extents[i], in[i].data());
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(std::memcmp(in[i].data(), out[i].data(), extents[i].bytes), 0)
        << store->Describe(extents[i]);
  }
  const NvmeStoreStats stats = store->stats();
  EXPECT_EQ(stats.used, total);
  EXPECT_EQ(stats.bytes_written, total);
  EXPECT_EQ(stats.bytes_read, total);
  EXPECT_EQ(stats.checksum_failures, 0u);
}

TEST_F(NvmeStoreTest, FreedRangesCoalesceBackToAWholeFile) {
  auto store = Open(kMiB, 1);
  ASSERT_TRUE(store);
  std::vector<Extent> quarters;
  for (int i = 0; i < 4; ++i) quarters.push_back(Alloc(*store, 256 * kKiB));
  EXPECT_EQ(store->Allocate(4096).status().code(), StatusCode::kNoSpace);
  for (int i : {1, 3, 0, 2}) store->Free(quarters[i]);
  const Extent whole = Alloc(*store, kMiB);
  EXPECT_EQ(whole.offset, 0u);
  EXPECT_EQ(whole.bytes, kMiB);
  EXPECT_EQ(store->stats().used, kMiB);
  EXPECT_EQ(store->stats().peak, kMiB);
  store->Free(whole);
  EXPECT_EQ(store->stats().used, 0u);
}

TEST_F(NvmeStoreTest, FullStoreIsNoSpaceNamingTheNumbersAndTheFix) {
  auto store = Open(kMiB, 2);
  ASSERT_TRUE(store);
  const Extent a = Alloc(*store, 512 * kKiB);
  Alloc(*store, 512 * kKiB);
  auto full = store->Allocate(4096);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kNoSpace);
  const std::string& msg = full.status().message();
  EXPECT_NE(msg.find("NVMe tier"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4096 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0 B free of 1.0 MiB capacity"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--nvme-budget"), std::string::npos) << msg;

  // Half the store is free, but no single file can hold 1 MiB.
  store->Free(a);
  auto split = store->Allocate(kMiB);
  ASSERT_FALSE(split.ok());
  const std::string& why = split.status().message();
  EXPECT_NE(why.find("512.0 KiB free"), std::string::npos) << why;
  EXPECT_NE(why.find("largest free extent 512.0 KiB"), std::string::npos)
      << why;
  EXPECT_NE(why.find("one swap file"), std::string::npos) << why;
}

TEST_F(NvmeStoreTest, FreedExtentLosesItsChecksum) {
  Written w = WriteOne(64 * kKiB, 7);
  ASSERT_TRUE(w.store);
  w.store->Free(w.extent);
  const Extent again = Alloc(*w.store, 64 * kKiB);
  ASSERT_EQ(again.offset, w.extent.offset);  // best fit reuses the range
  const Status st = w.store->Read(again, w.in.data());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("holds no valid data"), std::string::npos)
      << st.message();

  // Refused before any I/O: the caller's buffer is left alone.
  std::memset(w.in.data(), 0x5a, again.bytes);
  Result<PendingIo> io = w.store->StartRead(again, w.in.data());
  if (io.ok()) (void)w.store->FinishIo(*io);
  ASSERT_FALSE(io.ok()) << "StartRead accepted an extent never written";
  EXPECT_EQ(io.status().code(), StatusCode::kDataLoss);
  const std::vector<char> untouched(again.bytes, 0x5a);
  EXPECT_EQ(std::memcmp(w.in.data(), untouched.data(), again.bytes), 0);
}

TEST_F(NvmeStoreTest, ByteFlippedInTheSwapFileIsDataLossNamingFileAndOffset) {
  auto store = Open(2 * kMiB, 2);
  ASSERT_TRUE(store);
  Alloc(*store, 64 * kKiB);  // so the victim sits at a non-zero offset
  Alloc(*store, 64 * kKiB);
  const Extent e = Alloc(*store, 128 * kKiB);
  ASSERT_GT(e.offset, 0u);
  aio::PinnedBuffer out = Buffer(e.bytes);
  aio::PinnedBuffer in = Buffer(e.bytes);
  FillRandom(out.data(), e.bytes, 11);
  ASSERT_TRUE(store->Write(e, out.data()).ok());

  const std::string path = store->FilePath(e.file);
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  const uint64_t at = e.offset + 1000;
  const char flipped =
      static_cast<char>(static_cast<char*>(out.data())[1000] ^ 1);
  ASSERT_EQ(pwrite(fd, &flipped, 1, static_cast<off_t>(at)), 1);
  ASSERT_EQ(fsync(fd), 0);
  close(fd);

  const Status st = store->Read(e, in.data());
  ASSERT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos);
  EXPECT_NE(st.message().find("'" + path + "'"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("at offset " + std::to_string(e.offset)),
            std::string::npos)
      << st.message();
  EXPECT_EQ(store->stats().checksum_failures, 1u);
  EXPECT_EQ(store->stats().bytes_read, 0u);

  // Rewriting from the in-memory copy heals the extent.
  ASSERT_TRUE(store->Write(e, out.data()).ok());
  ASSERT_TRUE(store->Read(e, in.data()).ok());
  EXPECT_EQ(std::memcmp(in.data(), out.data(), e.bytes), 0);
}

TEST_F(NvmeStoreTest, FailedWriteKeepsTheSourceAndInvalidatesTheExtent) {
  Written w = WriteOne(256 * kKiB, 1);
  ASSERT_TRUE(w.store);
  NvmeStore& store = *w.store;
  const Extent& e = w.extent;
  aio::PinnedBuffer out = Buffer(e.bytes);
  FillRandom(out.data(), e.bytes, 2);
  const std::vector<char> copy(static_cast<char*>(out.data()),
                               static_cast<char*>(out.data()) + e.bytes);

  testutil::ErrnoInjector eio(EIO, e.offset + 64 * kKiB, 4096, /*times=*/1,
                              /*writes_only=*/true);
  faults_.Arm(&eio);
  const Status failed = store.Write(e, out.data());
  EXPECT_EQ(failed.code(), StatusCode::kIoError) << failed.ToString();
  EXPECT_EQ(eio.injected.load(), 1u);
  EXPECT_EQ(std::memcmp(out.data(), copy.data(), e.bytes), 0);
  EXPECT_EQ(store.stats().write_failures, 1u);

  // The old bytes may be half overwritten: the extent must not read back,
  // and is refused as holding no valid data, not by luck of the checksum.
  const Status read = store.Read(e, w.in.data());
  EXPECT_EQ(read.code(), StatusCode::kDataLoss) << read.ToString();
  EXPECT_NE(read.message().find("holds no valid data"), std::string::npos)
      << read.message();
  EXPECT_EQ(store.stats().checksum_failures, 0u);

  const Status retried = store.Write(e, out.data());
  ASSERT_TRUE(retried.ok()) << retried.ToString();
  ASSERT_TRUE(store.Read(e, w.in.data()).ok());
  EXPECT_EQ(std::memcmp(w.in.data(), out.data(), e.bytes), 0);
  faults_.Arm(nullptr);
}

TEST_F(NvmeStoreTest, WriteHittingAFullDeviceIsNoSpace) {
  auto store = Open(kMiB, 1);
  ASSERT_TRUE(store);
  const Extent e = Alloc(*store, 128 * kKiB);
  aio::PinnedBuffer out = Buffer(e.bytes);
  testutil::ErrnoInjector full(ENOSPC, e.offset, e.bytes, -1, true);
  faults_.Arm(&full);
  const Status st = store->Write(e, out.data());
  faults_.Arm(nullptr);
  EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.ToString();
  EXPECT_NE(st.message().find(store->Describe(e)), std::string::npos);
  EXPECT_EQ(store->Read(e, out.data()).code(), StatusCode::kDataLoss);
}

TEST_F(NvmeStoreTest, ReadErrorIsIoError) {
  Written w = WriteOne(128 * kKiB, 3);
  ASSERT_TRUE(w.store);
  testutil::ErrnoInjector eio(EIO, w.extent.offset, 4096, 1);
  faults_.Arm(&eio);
  const Status st = w.store->Read(w.extent, w.in.data());
  faults_.Arm(nullptr);
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_EQ(w.store->stats().checksum_failures, 0u);
  EXPECT_TRUE(w.store->Read(w.extent, w.in.data()).ok())
      << "the data is still good";
}

TEST_F(NvmeStoreTest, ShortTransfersAreCompletedAndVerify) {
  auto store = Open(2 * kMiB, 2);
  ASSERT_TRUE(store);
  testutil::ShortIoInjector shorts(4096);
  faults_.Arm(&shorts);
  for (int i = 0; i < 4; ++i) {
    const Extent e = Alloc(*store, 96 * kKiB);
    aio::PinnedBuffer out = Buffer(e.bytes);
    aio::PinnedBuffer in = Buffer(e.bytes);
    FillRandom(out.data(), e.bytes, 30 + i);
    const Status w = store->Write(e, out.data());
    ASSERT_TRUE(w.ok()) << w.ToString();
    const Status r = store->Read(e, in.data());
    ASSERT_TRUE(r.ok()) << r.ToString();
    EXPECT_EQ(std::memcmp(in.data(), out.data(), e.bytes), 0);
  }
  faults_.Arm(nullptr);
  EXPECT_GT(shorts.cuts.load(), 0u);
}

// The checksum covers the whole extent, its last page and byte included;
// the file itself stays intact.
TEST_F(NvmeStoreTest, BitFlippedInFlightIsDataLoss) {
  for (const bool last_byte : {false, true}) {
    SCOPED_TRACE(last_byte ? "last byte" : "second page");
    Written w = last_byte ? WriteOne(192 * kKiB, 6) : WriteOne(64 * kKiB, 5);
    ASSERT_TRUE(w.store);
    testutil::BitFlipInjector flip(w.extent.offset +
                                   (last_byte ? w.extent.bytes - 1 : 4097));
    faults_.Arm(&flip);
    const Status st = w.store->Read(w.extent, w.in.data());
    faults_.Arm(nullptr);
    ASSERT_TRUE(flip.flipped.load());
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
    EXPECT_EQ(w.store->stats().checksum_failures, 1u);
    ASSERT_TRUE(w.store->Read(w.extent, w.in.data()).ok())
        << "the file itself is intact";
    EXPECT_EQ(std::memcmp(w.in.data(), w.out.data(), w.extent.bytes), 0);
  }
}

TEST_F(NvmeStoreTest, NullOrMisalignedBufferIsInvalidArgument) {
  auto store = Open(kMiB, 1);
  ASSERT_TRUE(store);
  const Extent e = Alloc(*store, 64 * kKiB);
  aio::PinnedBuffer buf = Buffer(e.bytes + 4096);
  char* skewed = static_cast<char*>(buf.data()) + 512;
  auto w = store->StartWrite(e, skewed);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find(
                "aligned to " + std::to_string(store->alignment()) + " bytes"),
            std::string::npos)
      << w.status().message();
  EXPECT_EQ(store->StartRead(e, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Write(e, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST_F(NvmeStoreTest, DescribeNamesFileOffsetSizeAndPath) {
  auto store = Open(2 * kMiB, 2);
  ASSERT_TRUE(store);
  Alloc(*store, 4096);
  Alloc(*store, 4096);
  const Extent e = Alloc(*store, 8192);
  EXPECT_EQ(store->Describe(e), "extent 0:+0x1000 (8.0 KiB) of '" +
                                    dir_.path() + "/strata-swap-0.bin'");
  EXPECT_EQ(store->FilePath(1), dir_.path() + "/strata-swap-1.bin");
  EXPECT_EQ(store->dir(), dir_.path());
}

TEST_F(NvmeStoreTest, SecondOpenOfTheDirectoryFailsNamingTheHolderPid) {
  auto first = Open(kMiB, 1);
  ASSERT_TRUE(first);
  const std::string lock = dir_.File("strata.lock");
  std::ifstream lock_file(lock);
  std::string pid;
  lock_file >> pid;
  EXPECT_EQ(pid, std::to_string(getpid()));

  NvmeStoreOptions o;
  o.dir = dir_.path();
  o.capacity = kMiB;
  auto second = NvmeStore::Open(engine_.get(), o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  const std::string& msg = second.status().message();
  EXPECT_NE(msg.find("pid " + std::to_string(getpid())), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("another swap directory"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(dir_.File("strata-swap-0.bin")))
      << "the failed open must leave the holder's files alone";

  first.reset();
  EXPECT_FALSE(fs::exists(lock));
  EXPECT_FALSE(fs::exists(dir_.File("strata-swap-0.bin")));
  EXPECT_TRUE(Open(kMiB, 1)) << "the lock is released on destruction";
}

TEST_F(NvmeStoreTest, StaleSwapFilesAreReclaimedAndNothingElseIsTouched) {
  const auto make = [&](const std::string& name, size_t bytes) {
    std::ofstream(dir_.File(name)) << std::string(bytes, 'x');
  };
  make("strata-swap-0.bin", 8192);
  make("strata-swap-9.bin", 4096);
  make("notes.txt", 10);
  make("strata-swap-0.txt", 10);
  std::unique_ptr<NvmeStore> store;
  const std::string err =
      testutil::CaptureStderr([&] { store = Open(2 * kMiB, 2); });
  ASSERT_TRUE(store);
  EXPECT_NE(err.find("strata: reclaimed 2 swap files (12.0 KiB) left by a "
                     "previous run in " +
                     dir_.path()),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(dir_.File("strata-swap-9.bin")));
  EXPECT_EQ(fs::file_size(dir_.File("strata-swap-0.bin")), kMiB)
      << "replaced by a fresh swap file";
  EXPECT_EQ(fs::file_size(dir_.File("notes.txt")), 10u);
  EXPECT_EQ(fs::file_size(dir_.File("strata-swap-0.txt")), 10u);

  store.reset();
  const std::string quiet =
      testutil::CaptureStderr([&] { store = Open(kMiB, 1); });
  EXPECT_EQ(quiet.find("reclaimed"), std::string::npos) << quiet;
}

TEST_F(NvmeStoreTest, MissingDirectoryIsNotFoundNamingIt) {
  const std::string missing = dir_.File("no-such-dir");
  NvmeStoreOptions o;
  o.dir = missing;
  o.capacity = kMiB;
  auto s = NvmeStore::Open(engine_.get(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("'" + missing + "'"), std::string::npos);
  EXPECT_NE(s.status().message().find("mkdir -p"), std::string::npos);
  EXPECT_FALSE(fs::exists(missing));
}

TEST_F(NvmeStoreTest, BadOptionsAreInvalidArgument) {
  NvmeStoreOptions o;
  o.dir = dir_.path();
  o.capacity = 0;
  EXPECT_EQ(NvmeStore::Open(engine_.get(), o).status().code(),
            StatusCode::kInvalidArgument);
  o.capacity = kMiB;
  for (int files : {0, 65}) {
    o.files = files;
    EXPECT_EQ(NvmeStore::Open(engine_.get(), o).status().code(),
              StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(fs::is_empty(dir_.path()));
}

TEST_F(NvmeStoreTest, DiskTooSmallAtOpenIsNoSpaceAndLeavesNothingBehind) {
  testutil::Mount small("tmpfs", "size=1m");
  if (!small.ok()) GTEST_SKIP() << small.error();
  NvmeStoreOptions o;
  o.dir = small.path();
  o.capacity = 4 * kMiB;
  o.files = 4;
  Result<std::unique_ptr<NvmeStore>> s = Status(StatusCode::kInternal, "unset");
  testutil::CaptureStderr([&] { s = NvmeStore::Open(engine_.get(), o); });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNoSpace) << s.status().ToString();
  const std::string& msg = s.status().message();
  EXPECT_NE(msg.find("'" + small.path() + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4.0 MiB in all"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--nvme-budget"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_empty(small.path()))
      << "partial swap files and the lock file are removed";
}

TEST_F(NvmeStoreTest, ConcurrentWritersAndReadersOnDistinctExtents) {
  auto store = Open(8 * kMiB, 4);
  ASSERT_TRUE(store);
  constexpr int kThreads = 4;
  constexpr int kRounds = 12;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      aio::PinnedBuffer out = Buffer(128 * kKiB);
      aio::PinnedBuffer in = Buffer(128 * kKiB);
      for (int r = 0; r < kRounds; ++r) {
        const uint64_t bytes = (1 + (t + r) % 4) * 32 * kKiB;
        auto e = store->Allocate(bytes);
        if (!e.ok()) {
          ++failures;
          continue;
        }
        FillRandom(out.data(), bytes, t * 1000 + r);
        if (!store->Write(*e, out.data()).ok() ||
            !store->Read(*e, in.data()).ok() ||
            std::memcmp(in.data(), out.data(), bytes) != 0) {
          ++failures;
        }
        store->Free(*e);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const NvmeStoreStats stats = store->stats();
  EXPECT_EQ(stats.used, 0u);
  EXPECT_EQ(stats.bytes_written, stats.bytes_read);
  EXPECT_GT(stats.peak, 0u);
  EXPECT_EQ(stats.checksum_failures, 0u);
}

}  // namespace
}  // namespace strata::tier
