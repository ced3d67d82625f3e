//===- Timeline.h - A trace's timeline as trace events ----------*- C++ -*-===//
//
// What `ekka-trace export --perfetto` and `ekka-diagnose --perfetto` write:
// a trace's module calls and ops on the threads that ran them, and its GPU
// kernels on their streams, as Chrome trace-event JSON, which Perfetto's UI
// and chrome://tracing open. Each event's args point back to the trace: the
// module call, op or kernel id, and the captured tensors' shard and key.
//
// It reads a trace (format 1.8 or newer: the spans table) and writes JSON;
// it does not diagnose. What a diagnosis found comes in as marks: labels on
// module calls and on one op, which the events carry and which instant
// events show on the timeline.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_TRACE_TIMELINE_H
#define EKKA_TRACE_TIMELINE_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <string>

namespace ekka {

class TraceReader;

/// What to mark on the timeline, by rank (the index into the ranks given).
struct TimelineMarks {
  /// (rank, module call id) -> label ("suspect 1: model.layers.1.mlp, R = 60.4").
  std::map<std::pair<size_t, int64_t>, std::string> Calls;
  /// (rank, an op's place in its execution order, its `seq`) -> label.
  std::map<std::pair<size_t, int64_t>, std::string> Ops;
};

/// Counts of what a timeline holds.
struct TimelineSummary {
  uint64_t ModuleCalls = 0, Ops = 0, Kernels = 0, Threads = 0, Marks = 0;
  /// Spans that do not nest on their thread (an async record_function's),
  /// written as async event pairs.
  uint64_t Async = 0;
  /// Kernels with neither an op nor a module call that has a span (one
  /// launched outside any module call): left out.
  uint64_t KernelsWithoutSpan = 0;
};

/// Writes \p Ranks (one process each: a rank, or a single trace) as one
/// Chrome trace-event JSON document to \p OS. A trace older than format
/// 1.8 has no times to draw and is refused with an error naming it.
llvm::Expected<TimelineSummary> writeTimeline(llvm::raw_ostream &OS,
                                              llvm::ArrayRef<TraceReader *> Ranks,
                                              const TimelineMarks &Marks = {});

/// writeTimeline into the file \p Path ("-": standard output), written
/// beside it and renamed into place: a failed export leaves no file, and
/// one that was there stays as it was.
llvm::Expected<TimelineSummary> writeTimelineFile(llvm::StringRef Path,
                                                  llvm::ArrayRef<TraceReader *> Ranks,
                                                  const TimelineMarks &Marks = {});

} // namespace ekka

#endif
