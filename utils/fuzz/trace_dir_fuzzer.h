//===- trace_dir_fuzzer.h - A trace directory in one fuzz input -*- C++ -*-===//
//
// ekka-fuzz-trace_dir's input: the files of a trace directory, each after a
// marker line that names it,
//
//   "\0EKKA:" NAME "\n" CONTENT   (repeated; bytes before the first ignored)
//
// CONTENT runs to the next marker or the end. A marker, not a length, so
// that libFuzzer's insertions and deletions inside one file keep the others
// whole. NAME is a file of the trace (trace.db, trace.db-wal,
// tensors-0000.safetensors, started) or of one rank (rank-1/trace.db):
// letters, digits, '.', '_', '-', and at most one '/' after a rank-N
// directory; anything else (.., /abs, a/b/c) is no file. seed_trace_dir.py
// writes the same container from real traces.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_UTILS_FUZZ_TRACE_DIR_FUZZER_H
#define EKKA_UTILS_FUZZ_TRACE_DIR_FUZZER_H

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringRef.h"

#include <vector>

namespace ekka::fuzz {

struct TraceFile {
  llvm::StringRef Name, Content;
};

inline bool isTraceFileName(llvm::StringRef Name) {
  auto [Dir, File] = Name.split('/');
  if (!File.empty() || Name.ends_with("/")) {
    llvm::StringRef Rank = Dir;
    if (!Rank.consume_front("rank-") || Rank.empty() || !llvm::all_of(Rank, llvm::isDigit))
      return false;
    Name = File;
  }
  return !Name.empty() && Name.size() <= 64 && Name != "." && Name != ".." &&
         llvm::all_of(Name, [](char C) {
           return llvm::isAlnum(C) || C == '.' || C == '_' || C == '-';
         });
}

inline std::vector<TraceFile> splitTraceFiles(llvm::StringRef Input) {
  constexpr llvm::StringRef Marker("\0EKKA:", 6);
  std::vector<TraceFile> Files;
  size_t At = Input.find(Marker);
  while (At != llvm::StringRef::npos) {
    llvm::StringRef Rest = Input.drop_front(At + Marker.size());
    auto [Name, Body] = Rest.split('\n');
    size_t Next = Body.find(Marker);
    if (isTraceFileName(Name) && Name.size() < Rest.size())
      Files.push_back({Name, Body.take_front(Next)});
    if (Next == llvm::StringRef::npos)
      break;
    Input = Body;
    At = Next;
  }
  return Files;
}

} // namespace ekka::fuzz

#endif
