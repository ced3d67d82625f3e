//===- TensorRecording.h - From at::Tensor to a trace record ---*- C++ -*-===//
#ifndef EKKA_LIB_RUNTIME_TENSORRECORDING_H
#define EKKA_LIB_RUNTIME_TENSORRECORDING_H

#include "ekka/Trace/TraceFormat.h"
#include "ekka/Trace/TraceWriter.h"

#include <ATen/core/Tensor.h>

#include <atomic>
#include <optional>
#include <string>

namespace ekka {

/// The trace dtype of a tensor, if the trace can hold it.
std::optional<DType> traceDType(const at::Tensor &T);
/// Shape, strides, dtype and device of \p T into \p R.
bool describeTensor(const at::Tensor &T, TensorRecord &R);
/// Sum, sum of squares, min, max (in double precision) and NaN/Inf counts.
TensorStats tensorStats(const at::Tensor &T);
/// A contiguous CPU copy of \p T's bytes, into \p Out (whose memory is
/// reused where it is large enough): what it holds now, even if an op later
/// changes it in place.
void tensorBytes(const at::Tensor &T, std::string &Out);

/// For a tensor on a GPU: its statistics (or, with \p Bytes, its bytes)
/// copied to pinned host memory without blocking the program, in stream
/// order (so, as it is now, even if an op later changes it in place). The
/// completion, run on the trace writer's thread, waits for that copy and
/// fills in the record. A failure there leaves the record without them and
/// counts it in \p Lost. Not for a stream capturing a CUDA graph
/// (capturingGraph(): the caller asks first).
TraceWriter::Completion deviceReadback(const at::Tensor &T, bool Bytes,
                                       std::atomic<int64_t> &Lost);

/// Whether \p T is on a GPU whose current stream is capturing a CUDA graph:
/// nothing may be read back from it then (the read-back would be captured
/// into the graph).
bool capturingGraph(const at::Tensor &T);

} // namespace ekka

#endif
