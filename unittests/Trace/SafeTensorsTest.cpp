//===- SafeTensorsTest.cpp ------------------------------------------------===//
#include "ekka/Trace/SafeTensors.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <unistd.h>

using namespace ekka;
using namespace llvm;

namespace {

class SafeTensorsTest : public ::testing::Test {
protected:
  void SetUp() override { ASSERT_FALSE(sys::fs::createUniqueDirectory("ekka-st", Dir)); }
  void TearDown() override { sys::fs::remove_directories(Dir); }
  std::string path(StringRef Name) { return (Dir + "/" + Name).str(); }
  SmallString<128> Dir;
};

TEST_F(SafeTensorsTest, RoundTrip) {
  float A[6] = {1, 2, 3, 4, 5, 6};
  int64_t B[2] = {-7, 9};
  SafeTensorsWriter W;
  W.add("a", DType::F32, {2, 3}, StringRef(reinterpret_cast<char *>(A), sizeof(A)));
  W.add("b", DType::I64, {2}, StringRef(reinterpret_cast<char *>(B), sizeof(B)));
  ASSERT_FALSE(bool(W.writeTo(path("x.safetensors"), {{"format", "ekka-trace"}})));
  EXPECT_FALSE(sys::fs::exists(path("x.safetensors.tmp")));

  auto F = SafeTensorsFile::open(path("x.safetensors"));
  ASSERT_TRUE(bool(F)) << toString(F.takeError());
  ASSERT_EQ((*F)->tensors().size(), 2u);
  const SafeTensorInfo *Info = (*F)->find("a");
  ASSERT_TRUE(Info);
  EXPECT_EQ(Info->Shape, (std::vector<int64_t>{2, 3}));
  StringRef Bytes = (*F)->bytes(*Info);
  ASSERT_EQ(Bytes.size(), sizeof(A));
  EXPECT_EQ(std::memcmp(Bytes.data(), A, sizeof(A)), 0);
  EXPECT_EQ((*F)->metadata().at("format"), "ekka-trace");
}

// Buffers handed over are written as they are, after copied ones, and
// given back afterwards.
TEST_F(SafeTensorsTest, KeptBuffersAreWrittenAndGivenBack) {
  float A[16] = {1, 2}; // more than a string holds in itself
  SafeTensorsWriter W;
  W.add("a", DType::F32, {16}, StringRef(reinterpret_cast<char *>(A), sizeof(A)));
  std::string B(reinterpret_cast<char *>(A), sizeof(A));
  B[0] = 7;
  const char *Kept = B.data();
  W.add("b", DType::F32, {16}, std::move(B));
  EXPECT_EQ(W.dataBytes(), 2 * sizeof(A));
  ASSERT_FALSE(bool(W.writeTo(path("x.safetensors"))));
  auto F = SafeTensorsFile::open(path("x.safetensors"));
  ASSERT_TRUE(bool(F)) << toString(F.takeError());
  EXPECT_EQ((*F)->bytes(*(*F)->find("a")), StringRef(reinterpret_cast<char *>(A), sizeof(A)));
  StringRef Second = (*F)->bytes(*(*F)->find("b"));
  ASSERT_EQ(Second.size(), sizeof(A));
  EXPECT_EQ(Second[0], 7);
  std::vector<std::string> Back = W.takeBuffers();
  ASSERT_EQ(Back.size(), 2u);
  EXPECT_EQ(Back[1].data(), Kept);
  EXPECT_TRUE(W.empty());
  EXPECT_EQ(W.dataBytes(), 0u);
}

// Linux's count of this process's resident file pages, in KiB.
/// The pages of files mapped into this process: RssFile, and RssShmem for
/// a file on tmpfs (where /tmp is one).
long residentFileKiB() {
  FILE *Status = std::fopen("/proc/self/status", "r");
  if (!Status)
    return -1;
  char Line[256];
  long KiB = -1, Part = 0;
  while (std::fgets(Line, sizeof(Line), Status))
    if (std::sscanf(Line, "RssFile: %ld kB", &Part) == 1 ||
        std::sscanf(Line, "RssShmem: %ld kB", &Part) == 1)
      KiB = (KiB < 0 ? 0 : KiB) + Part;
  std::fclose(Status);
  return KiB;
}

// A mapped shard gives its pages back and still reads the same; a small
// one, read into the heap rather than mapped, is left alone (the same
// advice on heap memory would zero it).
TEST_F(SafeTensorsTest, DroppedPagesReadBackTheSame) {
  for (size_t N : {size_t(64), size_t(1) << 20}) {
    std::vector<float> A(N);
    for (size_t I = 0; I < N; ++I)
      A[I] = float(I % 1000) + 0.5f;
    StringRef Want(reinterpret_cast<char *>(A.data()), N * sizeof(float));
    SafeTensorsWriter W;
    W.add("a", DType::F32, {int64_t(N)}, Want);
    ASSERT_FALSE(bool(W.writeTo(path("x.safetensors"))));
    auto F = SafeTensorsFile::open(path("x.safetensors"));
    ASSERT_TRUE(bool(F)) << toString(F.takeError());
    StringRef Bytes = (*F)->bytes(*(*F)->find("a"));
    ASSERT_EQ(Bytes, Want);
    long Before = residentFileKiB();
    (*F)->dropResidentPages();
    long After = residentFileKiB();
    if (N > 64 && Before >= 0) // 4 MiB mapped and read, then given back
      EXPECT_GE(Before - After, 3 * 1024) << "resident file pages " << Before << " -> " << After;
    EXPECT_EQ(Bytes, Want) << N << " floats";
    ASSERT_FALSE(bool(sys::fs::remove(path("x.safetensors"))));
  }
}

TEST_F(SafeTensorsTest, TruncatedFileIsAClearError) {
  float A[64] = {};
  SafeTensorsWriter W;
  W.add("a", DType::F32, {64}, StringRef(reinterpret_cast<char *>(A), sizeof(A)));
  ASSERT_FALSE(bool(W.writeTo(path("x.safetensors"))));
  ASSERT_EQ(::truncate(path("x.safetensors").c_str(), 100), 0);
  auto F = SafeTensorsFile::open(path("x.safetensors"));
  ASSERT_FALSE(bool(F));
  std::string Msg = toString(F.takeError());
  EXPECT_NE(Msg.find("is not a valid safetensors file"), std::string::npos) << Msg;
  EXPECT_NE(Msg.find("truncated"), std::string::npos) << Msg;
}

// A header of the right length that is not JSON: the error says where,
// counting from the header's first byte (the file's ninth).
TEST_F(SafeTensorsTest, GarbageIsAClearError) {
  {
    std::error_code EC;
    raw_fd_ostream OS(path("bad.safetensors"), EC);
    // Written with its length: a C string would stop at the first NUL.
    static const char Bytes[] = "\x10\0\0\0\0\0\0\0{not json at all";
    OS.write(Bytes, sizeof(Bytes) - 1);
  }
  auto F = SafeTensorsFile::open(path("bad.safetensors"));
  ASSERT_FALSE(bool(F));
  std::string Msg = toString(F.takeError());
  EXPECT_NE(Msg.find("is not a valid safetensors file: header is not a valid JSON object "
                     "(expected a member's name at byte 1)"),
            std::string::npos)
      << Msg;
}

// Each entry's bytes are its own: entries that share bytes are refused,
// but an empty tensor, which has none, may sit anywhere (the writer puts it
// where the next one starts).
TEST_F(SafeTensorsTest, OverlappingEntriesAreRefusedEmptyOnesNot) {
  auto Write = [&](StringRef Name, StringRef Header) {
    std::string Text = Header.str();
    Text.append((8 - Text.size() % 8) % 8, ' ');
    std::error_code EC;
    raw_fd_ostream OS(path(Name), EC);
    char Length[8];
    uint64_t N = Text.size();
    std::memcpy(Length, &N, 8);
    OS.write(Length, 8);
    OS << Text << std::string(16, '\0');
  };
  Write("empty.safetensors",
        R"({"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
        R"("a":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
        R"("c":{"dtype":"F32","shape":[0],"data_offsets":[16,16]}})");
  auto F = SafeTensorsFile::open(path("empty.safetensors"));
  ASSERT_TRUE(bool(F)) << toString(F.takeError());
  EXPECT_EQ((*F)->tensors().size(), 3u);
  Write("shared.safetensors",
        R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})");
  auto G = SafeTensorsFile::open(path("shared.safetensors"));
  ASSERT_FALSE(bool(G));
  EXPECT_NE(toString(G.takeError()).find("entries 'a' and 'b' overlap"), std::string::npos);
}

// F4's shape counts 4-bit values: half a byte each, as safetensors' header
// says; sizes that disagree, or a shape whose count wraps around 64 bits
// (to seem to match), are refused.
TEST_F(SafeTensorsTest, SizesFollowTheTypesBits) {
  auto Open = [&](StringRef Header, size_t DataBytes) {
    std::string Text = Header.str();
    Text.append((8 - Text.size() % 8) % 8, ' ');
    {
      std::error_code EC;
      raw_fd_ostream OS(path("h.safetensors"), EC);
      uint64_t Length = Text.size();
      OS.write(reinterpret_cast<const char *>(&Length), 8);
      OS << Text << std::string(DataBytes, '\x21');
    }
    return SafeTensorsFile::open(path("h.safetensors"));
  };
  auto F = Open(R"({"a":{"dtype":"F4","shape":[2,6],"data_offsets":[0,6]}})", 6);
  ASSERT_TRUE(bool(F)) << toString(F.takeError());
  EXPECT_EQ((*F)->find("a")->Type, DType::F4);
  auto Wrong = Open(R"({"a":{"dtype":"F4","shape":[2,6],"data_offsets":[0,12]}})", 12);
  ASSERT_FALSE(bool(Wrong));
  EXPECT_NE(toString(Wrong.takeError()).find("12 bytes for 12 elements of F4"), std::string::npos);
  // 2^62 * 4 elements of F32 would be 2^66 bytes: 0 once wrapped.
  auto Huge = Open(
      R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0);
  ASSERT_FALSE(bool(Huge));
  EXPECT_NE(toString(Huge.takeError()).find("too large"), std::string::npos);
}

} // namespace
