//===- trace_dir_fuzzer.cpp - The trace reader over a whole directory -----===//
//
// Any bytes as a trace directory somebody sent: its trace.db (SQLite) and
// its safetensors shards mutated together. The input is a small container
// (trace_dir_fuzzer.h) of named files, written into a directory of this
// process's own; the trace is then opened as the tools open it
// (TraceReader::openRanks) and everything in it is read: every table, the
// counts, the tallies, the missing shards, the timeline, and every captured
// tensor's bytes. The reader's promises: whatever the bytes, it answers
// with an llvm::Error or a value, never a crash, a hang or a leak; and a
// tensor's bytes it hands out are exactly the tensor's (its dtype times its
// shape) and lie inside its shard, at the place the shard's header gives.
//
//===----------------------------------------------------------------------===//
#include "trace_dir_fuzzer.h"

#include "ekka/Trace/SafeTensors.h"
#include "ekka/Trace/Timeline.h"
#include "ekka/Trace/TraceFormat.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

using namespace llvm;

namespace {

/// This process's trace directory, made once, emptied before each input
/// and removed at exit.
const std::string &traceDirectory() {
  static const std::string *Dir = [] {
    SmallString<128> Path;
    if (sys::fs::createUniqueDirectory("ekka-fuzz-trace_dir", Path))
      std::abort(); // no temporary directory: nothing can be fuzzed
    std::atexit([] { (void)sys::fs::remove_directories(traceDirectory()); });
    return new std::string(Path);
  }();
  return *Dir;
}

template <typename T> bool ok(Expected<T> &V) {
  if (V)
    return true;
  consumeError(V.takeError());
  return false;
}

/// What the reader answered, a value or an error, dropped once read.
template <typename T> void drop(Expected<T> V) { (void)ok(V); }

/// The bytes the reader gave for \p T must be the tensor's, at the place
/// its shard's header gives, inside the shard in \p RankDir (read again
/// here: a file SQLite made there, trace.db-shm, is one too).
void checkTensorBytes(const ekka::TensorRecord &T, StringRef Bytes, StringRef RankDir) {
  uint64_t Elements = 1;
  for (int64_t D : T.Shape)
    Elements *= uint64_t(D); // the reader refuses shapes whose product overflows
  std::optional<uint64_t> Size = ekka::dtypeBytes(T.Type, Elements);
  if (!Size || Bytes.size() != *Size)
    std::abort(); // bytes that are not the tensor's dtype times its shape
  SmallString<128> Path(RankDir);
  sys::path::append(Path, T.Shard);
  auto Shard = MemoryBuffer::getFile(Path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!Shard)
    std::abort(); // bytes from a shard the trace does not hold
  StringRef Content = (*Shard)->getBuffer();
  auto Parsed = ekka::SafeTensorsFile::parse(
      MemoryBuffer::getMemBufferCopy(Content, T.Shard), T.Shard);
  if (!Parsed)
    std::abort(); // the reader accepted a shard the parser refuses
  const ekka::SafeTensorInfo *Info = (*Parsed)->find(T.Key);
  if (!Info || Content.size() < 8)
    std::abort();
  uint64_t HeaderSize = 0;
  for (int I = 7; I >= 0; --I)
    HeaderSize = HeaderSize << 8 | uint8_t(Content[I]);
  uint64_t Begin = 8 + HeaderSize + Info->Begin, End = 8 + HeaderSize + Info->End;
  if (End < Begin || End > Content.size() || End - Begin != Bytes.size() ||
      std::memcmp(Content.data() + Begin, Bytes.data(), Bytes.size()) != 0)
    std::abort(); // bytes outside the shard, or not the ones its header names
  (void)ekka::statsOfBytes(T.Type, Bytes); // as a diagnosis reads them
}

/// Everything the tools read of one rank's trace.
void readRank(ekka::TraceReader &R) {
  (void)R.meta();
  (void)R.formatAtLeast(1, 8);
  drop(R.moduleCalls());
  drop(R.ops());
  drop(R.kernels());
  drop(R.spans());
  drop(R.counts());
  for (const char *Table : {"module_calls", "ops", "kernels", "tensors"})
    drop(R.rowCount(Table));
  drop(R.tallyPerModuleCall());
  drop(R.missingShards());
  auto Tensors = R.tensors();
  if (!ok(Tensors))
    return;
  for (const ekka::TensorRecord &T : *Tensors) {
    auto Bytes = R.tensorBytes(T);
    if (ok(Bytes))
      checkTensorBytes(T, *Bytes, R.directory());
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  const std::string &Dir = traceDirectory();
  if (sys::fs::remove_directories(Dir) || sys::fs::create_directory(Dir))
    std::abort(); // the directory of the last input could not be emptied
  std::map<std::string, StringRef> Files;
  for (const ekka::fuzz::TraceFile &F :
       ekka::fuzz::splitTraceFiles(StringRef(reinterpret_cast<const char *>(Data), Size)))
    Files[F.Name.str()] = F.Content; // a later file of one name wins
  for (const auto &[Name, Content] : Files) {
    SmallString<128> Path(Dir);
    sys::path::append(Path, Name);
    (void)sys::fs::create_directories(sys::path::parent_path(Path));
    std::error_code EC;
    raw_fd_ostream OS(Path, EC, sys::fs::OF_None);
    if (EC)
      continue; // rank-1 a file and rank-1/trace.db a file too: one of them
    OS << Content;
  }

  (void)ekka::TraceReader::startedRanks(Dir);
  auto Ranks = ekka::TraceReader::openRanks(Dir);
  if (!ok(Ranks))
    return 0;
  std::vector<ekka::TraceReader *> Readers;
  for (auto &R : *Ranks) {
    if (!R->directory().starts_with(Dir))
      std::abort(); // a rank outside the trace
    readRank(*R);
    Readers.push_back(R.get());
  }
  raw_null_ostream Null;
  drop(ekka::writeTimeline(Null, Readers));
  return 0;
}
