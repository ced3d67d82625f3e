//===- Timeline.cpp - A trace's timeline as Chrome trace events -----------===//
//
// The trace-event format (Chrome's "Trace Event Format" document): a JSON
// object whose traceEvents are complete events (ph "X": ts and dur in
// microseconds) on a pid and tid, metadata events (ph "M") naming them, and
// instant events (ph "i") for the marks. Each rank is a process whose
// threads are the OS threads that ran its module calls and ops; its GPU
// kernels go on a process of their own, a track per stream.
//
//===----------------------------------------------------------------------===//
#include "ekka/Trace/Timeline.h"
#include "ekka/Support/Error.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"

#include <algorithm>
#include <set>
#include <vector>

using namespace llvm;

namespace ekka {

namespace {

/// One rank's records, indexed for the events.
struct RankRecords {
  std::vector<ModuleCallRecord> Calls;
  std::vector<OpRecord> Ops;
  std::vector<KernelRecord> Kernels;
  std::vector<TensorRecord> Tensors;
  std::vector<SpanRecord> Spans;
  DenseMap<int64_t, size_t> CallAt, OpAt;
  /// Tensors by (owner, id), as indexes into Tensors.
  std::map<std::pair<TensorOwner, int64_t>, std::vector<size_t>> TensorsOf;
  /// Span by (owner, id).
  std::map<std::pair<TensorOwner, int64_t>, size_t> SpanOf;
};

Expected<RankRecords> readRank(TraceReader &R) {
  if (!R.formatAtLeast(1, 8)) {
    auto Format = R.meta().find("format");
    return makeError("'" + R.directory() + "' is a trace of format " +
                     (Format != R.meta().end() ? Format->second : std::string("unknown")) +
                     ", which records no times (spans came with ekka-trace 1.8): trace the "
                     "program again to export its timeline");
  }
  RankRecords Out;
  auto Take = [](auto Records, auto &Into) -> Error {
    if (!Records)
      return Records.takeError();
    Into = std::move(*Records);
    return Error::success();
  };
  if (Error E = Take(R.moduleCalls(), Out.Calls))
    return E;
  if (Error E = Take(R.ops(), Out.Ops))
    return E;
  if (Error E = Take(R.kernels(), Out.Kernels))
    return E;
  if (Error E = Take(R.tensors(), Out.Tensors))
    return E;
  if (Error E = Take(R.spans(), Out.Spans))
    return E;
  if (Error E = R.checkReferences(Out.Calls, Out.Ops, Out.Kernels, Out.Tensors))
    return E;
  for (size_t I = 0; I < Out.Calls.size(); ++I)
    Out.CallAt[Out.Calls[I].Id] = I;
  for (size_t I = 0; I < Out.Ops.size(); ++I)
    Out.OpAt[Out.Ops[I].Id] = I;
  for (size_t I = 0; I < Out.Tensors.size(); ++I)
    Out.TensorsOf[{Out.Tensors[I].Owner, Out.Tensors[I].OwnerId}].push_back(I);
  for (size_t I = 0; I < Out.Spans.size(); ++I) {
    const SpanRecord &S = Out.Spans[I];
    bool Known = S.Owner == TensorOwner::ModuleCall ? Out.CallAt.count(S.OwnerId)
                                                    : Out.OpAt.count(S.OwnerId);
    if (!Known)
      return makeError("'" + R.directory() + "' is corrupt: a span names " +
                       ownerName(S.Owner) + " " + Twine(S.OwnerId) + ", which it does not hold");
    Out.SpanOf[{S.Owner, S.OwnerId}] = I;
  }
  return Out;
}

/// Which of \p Spans (by start, the longer first) do not nest on their
/// thread: one that begins inside another and ends after it. A complete
/// event must nest in those around it on its track.
std::vector<bool> asyncSpans(const std::vector<SpanRecord> &Spans) {
  std::vector<bool> Async(Spans.size());
  std::map<int64_t, std::vector<const SpanRecord *>> Open; // by thread
  for (size_t I = 0; I < Spans.size(); ++I) {
    const SpanRecord &S = Spans[I];
    std::vector<const SpanRecord *> &Stack = Open[S.Thread];
    while (!Stack.empty() && S.StartNs >= Stack.back()->EndNs)
      Stack.pop_back();
    if (!Stack.empty() && S.EndNs > Stack.back()->EndNs)
      Async[I] = true;
    else
      Stack.push_back(&S);
  }
  return Async;
}

/// Trace-event times are microseconds; the trace's are nanoseconds.
double micros(int64_t Ns, int64_t Origin) { return double(Ns - Origin) / 1000.0; }

void writeTensors(json::OStream &J, const RankRecords &R, TensorOwner Owner, int64_t Id) {
  auto It = R.TensorsOf.find({Owner, Id});
  if (It == R.TensorsOf.end())
    return;
  J.attributeArray("tensors", [&] {
    for (size_t I : It->second) {
      const TensorRecord &T = R.Tensors[I];
      J.object([&] {
        J.attribute("tensor_id", T.Id);
        J.attribute("role", T.Role);
        J.attribute("index", T.Index);
        if (T.SourceId) { // the dataflow: that earlier output, unchanged
          J.attribute("source_id", *T.SourceId);
          return;
        }
        J.attribute("dtype", dtypeName(T.Type));
        J.attributeArray("shape", [&] {
          for (int64_t D : T.Shape)
            J.value(D);
        });
        if (!T.Shard.empty()) {
          J.attribute("shard", T.Shard);
          J.attribute("key", T.Key);
        }
      });
    }
  });
}

void writeMetadata(json::OStream &J, StringRef What, int64_t Pid, std::optional<int64_t> Tid,
                   StringRef Name) {
  J.object([&] {
    J.attribute("ph", "M");
    J.attribute("name", What);
    J.attribute("pid", Pid);
    if (Tid)
      J.attribute("tid", *Tid);
    J.attributeObject("args", [&] { J.attribute("name", Name); });
  });
}

void writeSortIndex(json::OStream &J, int64_t Pid) {
  J.object([&] {
    J.attribute("ph", "M");
    J.attribute("name", "process_sort_index");
    J.attribute("pid", Pid);
    J.attributeObject("args", [&] { J.attribute("sort_index", Pid); });
  });
}

void writeInstant(json::OStream &J, StringRef Name, int64_t Pid, int64_t Tid, double Ts) {
  J.object([&] {
    J.attribute("ph", "i");
    J.attribute("s", "t");
    J.attribute("cat", "ekka");
    J.attribute("name", Name);
    J.attribute("pid", Pid);
    J.attribute("tid", Tid);
    J.attribute("ts", Ts);
  });
}

std::string callName(const ModuleCallRecord &C) {
  return C.Path.empty() ? "(root " + C.ClassName + ")" : C.Path;
}

/// A rank's GPU kernels, on its GPU process, a track per stream. Their
/// times on the GPU are not recorded: each is placed inside the span of
/// the op that launched it (or of its module call, for a kernel launched
/// outside any op: Triton's, Inductor's), at its share of that span, and
/// the kernels of a stream follow one another in launch order without
/// overlapping (a parent op's kernels and its child op's take turns).
void writeKernels(json::OStream &J, const RankRecords &R, StringRef Process,
                  int64_t GpuPid, int64_t Origin, TimelineSummary &Summary) {
  struct Placed {
    const KernelRecord *K;
    const SpanRecord *Host;
    double Ts, End; // microseconds, from Origin
  };
  // Each host span's kernels, in launch order, share it evenly.
  std::map<std::pair<TensorOwner, int64_t>, std::vector<const KernelRecord *>> ByHost;
  for (const KernelRecord &K : R.Kernels) {
    auto Host = R.SpanOf.end();
    if (K.OpId)
      Host = R.SpanOf.find({TensorOwner::Op, *K.OpId});
    if (Host == R.SpanOf.end() && K.ModuleCallId)
      Host = R.SpanOf.find({TensorOwner::ModuleCall, *K.ModuleCallId});
    if (Host == R.SpanOf.end()) {
      ++Summary.KernelsWithoutSpan;
      continue;
    }
    ByHost[Host->first].push_back(&K);
  }
  std::map<uint64_t, std::vector<Placed>> ByStream;
  for (const auto &[Host, Kernels] : ByHost) {
    const SpanRecord &S = R.Spans[R.SpanOf.at(Host)];
    double Start = micros(S.StartNs, Origin), End = micros(S.EndNs, Origin);
    double Share = (End - Start) / double(Kernels.size());
    for (size_t I = 0; I < Kernels.size(); ++I)
      ByStream[Kernels[I]->Stream].push_back(
          {Kernels[I], &S, Start + Share * double(I), Start + Share * double(I + 1)});
  }
  if (ByStream.empty())
    return;
  writeMetadata(J, "process_name", GpuPid, std::nullopt,
                Process.str() + " GPU kernels (placed within the ops that launched them)");
  writeSortIndex(J, GpuPid);
  for (auto &[Stream, Kernels] : ByStream) {
    writeMetadata(J, "thread_name", GpuPid, int64_t(Stream), "stream " + std::to_string(Stream));
    llvm::sort(Kernels, [](const Placed &A, const Placed &B) { return A.K->Seq < B.K->Seq; });
    // One after another: a kernel starts no earlier than the last ended,
    // and ends before the next one's place where that comes later (else
    // the next is pushed after it).
    double Cursor = 0;
    for (size_t I = 0; I < Kernels.size(); ++I) {
      Placed &P = Kernels[I];
      P.Ts = std::max(P.Ts, Cursor);
      if (I + 1 < Kernels.size() && Kernels[I + 1].Ts > P.Ts)
        P.End = std::min(P.End, Kernels[I + 1].Ts);
      P.End = std::max(P.End, P.Ts);
      Cursor = P.End;
      const KernelRecord &K = *P.K;
      J.object([&] {
        J.attribute("ph", "X");
        J.attribute("cat", "kernel");
        J.attribute("name", K.Name);
        J.attribute("pid", GpuPid);
        J.attribute("tid", int64_t(K.Stream));
        J.attribute("ts", P.Ts);
        J.attribute("dur", P.End - P.Ts);
        J.attributeObject("args", [&] {
          J.attribute("kernel_id", K.Id);
          if (K.OpId)
            J.attribute("op_id", *K.OpId);
          if (K.ModuleCallId)
            J.attribute("module_call_id", *K.ModuleCallId);
          auto Dim3 = [&](StringRef Name, const uint32_t D[3]) {
            J.attributeArray(Name, [&] {
              for (int I = 0; I < 3; ++I)
                J.value(int64_t(D[I]));
            });
          };
          Dim3("grid", K.Grid);
          Dim3("block", K.Block);
          J.attribute("shared_mem", int64_t(K.SharedMem));
          J.attribute("stream", int64_t(K.Stream));
          J.attribute("correlation_id", int64_t(K.CorrelationId));
          J.attribute("placement",
                      P.Host->Owner == TensorOwner::Op
                          ? "within the span of the op that launched it: kernel times are not "
                            "recorded"
                          : "within its module call's span (launched outside any op): kernel "
                            "times are not recorded");
          writeTensors(J, R, TensorOwner::Kernel, K.Id);
        });
      });
      ++Summary.Kernels;
    }
  }
}

} // namespace

Expected<TimelineSummary> writeTimeline(raw_ostream &OS, ArrayRef<TraceReader *> Ranks,
                                        const TimelineMarks &Marks) {
  std::vector<RankRecords> All;
  int64_t Origin = INT64_MAX;
  for (TraceReader *R : Ranks) {
    auto Records = readRank(*R);
    if (!Records)
      return Records.takeError();
    for (const SpanRecord &S : Records->Spans)
      Origin = std::min(Origin, S.StartNs);
    All.push_back(std::move(*Records));
  }
  if (Origin == INT64_MAX)
    Origin = 0;

  TimelineSummary Summary;
  json::OStream J(OS, /*IndentSize=*/0);
  J.object([&] {
    J.attribute("displayTimeUnit", "ns");
    J.attributeArray("traceEvents", [&] {
      for (size_t Rank = 0; Rank < All.size(); ++Rank) {
        const RankRecords &R = All[Rank];
        // Processes from 1: some viewers take pid 0 for the kernel's.
        int64_t Pid = int64_t(Rank) + 1, GpuPid = int64_t(All.size() + Rank) + 1;
        // A rank-N/ or process-PID/ directory names its process.
        StringRef Dir = Ranks[Rank]->directory();
        StringRef Base = sys::path::filename(Dir.rtrim('/'));
        std::string Process = All.size() == 1                ? std::string("trace")
                              : Base.starts_with("rank-")    ? "rank " + Base.drop_front(5).str()
                              : Base.starts_with("process-") ? "process " + Base.drop_front(8).str()
                                                             : Base.str();
        writeMetadata(J, "process_name", Pid, std::nullopt, Process + " " + Dir.str());
        writeSortIndex(J, Pid);
        std::set<int64_t> Threads;
        for (const SpanRecord &S : R.Spans)
          Threads.insert(S.Thread);
        for (int64_t T : Threads)
          writeMetadata(J, "thread_name", Pid, T, "thread " + std::to_string(T));
        Summary.Threads += Threads.size();

        // Module calls and ops, by start (a parent before what it holds).
        std::vector<bool> Async = asyncSpans(R.Spans);
        for (size_t SpanIndex = 0; SpanIndex < R.Spans.size(); ++SpanIndex) {
          const SpanRecord &S = R.Spans[SpanIndex];
          double Ts = micros(S.StartNs, Origin), Dur = double(S.EndNs - S.StartNs) / 1000.0;
          std::string Mark;
          bool IsCall = S.Owner == TensorOwner::ModuleCall;
          const ModuleCallRecord *C = IsCall ? &R.Calls[R.CallAt.lookup(S.OwnerId)] : nullptr;
          const OpRecord *O = IsCall ? nullptr : &R.Ops[R.OpAt.lookup(S.OwnerId)];
          if (C)
            if (auto It = Marks.Calls.find({Rank, C->Id}); It != Marks.Calls.end())
              Mark = It->second;
          if (O)
            if (auto It = Marks.Ops.find({Rank, O->Seq}); It != Marks.Ops.end())
              Mark = It->second;
          // A span that does not nest in the one around it on its thread (an
          // async record_function, ended after its caller returned: gloo's
          // send) is an async event pair, which viewers draw on a track of
          // its own.
          bool IsAsync = Async[SpanIndex];
          std::string Name = C ? callName(*C) : O->Name;
          std::string AsyncId = (IsCall ? "module_call " : "op ") + std::to_string(S.OwnerId);
          J.object([&] {
            J.attribute("ph", IsAsync ? "b" : "X");
            J.attribute("cat", IsCall ? "module" : "op");
            J.attribute("name", Name);
            J.attribute("pid", Pid);
            J.attribute("tid", S.Thread);
            J.attribute("ts", Ts);
            if (IsAsync)
              J.attribute("id", AsyncId);
            else
              J.attribute("dur", Dur);
            if (!Mark.empty())
              J.attribute("cname", "terrible"); // Chrome's red
            J.attributeObject("args", [&] {
              if (C) {
                J.attribute("module_call_id", C->Id);
                J.attribute("class", C->ClassQualname);
                J.attribute("step", C->Step);
                J.attribute("seq", C->Seq);
                if (C->ParentId)
                  J.attribute("parent_id", *C->ParentId);
                if (!C->SourceFile.empty())
                  J.attribute("source", C->SourceFile + ":" + std::to_string(C->SourceLine));
              } else {
                J.attribute("op_id", O->Id);
                if (O->ModuleCallId)
                  J.attribute("module_call_id", *O->ModuleCallId);
                J.attribute("seq", O->Seq);
                if (!O->Schema.empty())
                  J.attribute("schema", O->Schema);
              }
              if (!Mark.empty())
                J.attribute("ekka", Mark);
              writeTensors(J, R, S.Owner, S.OwnerId);
            });
          });
          if (IsAsync) {
            J.object([&] {
              J.attribute("ph", "e");
              J.attribute("cat", IsCall ? "module" : "op");
              J.attribute("name", Name);
              J.attribute("pid", Pid);
              J.attribute("tid", S.Thread);
              J.attribute("ts", micros(S.EndNs, Origin));
              J.attribute("id", AsyncId);
            });
            ++Summary.Async;
          }
          if (!Mark.empty()) {
            writeInstant(J, Mark, Pid, S.Thread, Ts);
            ++Summary.Marks;
          }
          ++(IsCall ? Summary.ModuleCalls : Summary.Ops);
        }

        writeKernels(J, R, Process, GpuPid, Origin, Summary);
      }
    });
    J.attributeObject("otherData", [&] {
      J.attribute("exported_by", "ekka");
      J.attributeArray("traces", [&] {
        for (TraceReader *R : Ranks)
          J.value(R->directory());
      });
      J.attribute("clock", "CLOCK_MONOTONIC of the traced process; ts from its first span");
      J.attribute("time_origin_ns", Origin);
      J.attribute("kernel_times", "not recorded: each kernel is drawn within the span of the op "
                                  "(or module call) that launched it");
      J.attribute("kernels_left_out", int64_t(Summary.KernelsWithoutSpan));
    });
  });
  OS << "\n";
  return Summary;
}

Expected<TimelineSummary> writeTimelineFile(StringRef Path, ArrayRef<TraceReader *> Ranks,
                                            const TimelineMarks &Marks) {
  if (Path == "-") {
    auto Summary = writeTimeline(outs(), Ranks, Marks);
    outs().flush();
    return Summary;
  }
  std::string Temp = (Path + ".part").str();
  std::error_code EC;
  raw_fd_ostream OS(Temp, EC);
  if (EC)
    return makeError("cannot write '" + Path + "': " + EC.message());
  auto Summary = writeTimeline(OS, Ranks, Marks);
  OS.close();
  if (!Summary || OS.has_error()) {
    sys::fs::remove(Temp);
    if (!Summary)
      return Summary.takeError();
    std::error_code Why = OS.error();
    OS.clear_error();
    return makeError("cannot write '" + Path + "': " + Why.message());
  }
  if (std::error_code RenameEC = sys::fs::rename(Temp, Path)) {
    sys::fs::remove(Temp);
    return makeError("cannot write '" + Path + "': " + RenameEC.message());
  }
  return Summary;
}

} // namespace ekka
