//===- Side.h - One trace, indexed for the comparison -----------*- C++ -*-===//
//
// Internal to lib/Analysis: a trace (or the joined stages of a pipeline-
// parallel run) with its calls, ops, kernels and tensors indexed, and the
// values of its captured tensors.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_LIB_ANALYSIS_SIDE_H
#define EKKA_LIB_ANALYSIS_SIDE_H

#include "ekka/Align/Transforms.h"
#include "ekka/Analysis/Diagnosis.h"
#include "ekka/Analysis/ServedRequests.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace ekka {
namespace detail {

using namespace llvm;

/// One side's trace, indexed for the comparison. A pipeline-parallel run's
/// stages (ranks that ran different modules) are joined into one: their
/// ids are kept apart by the stage in their top bits.
struct Side {
  static constexpr int StageShift = PipelineStageShift;
  TraceReader *Reader = nullptr;
  std::vector<TraceReader *> Stages; ///< When joined: each stage's trace.
  std::vector<ModuleCallRecord> Calls;
  std::vector<OpRecord> Ops;
  std::vector<KernelRecord> Kernels;
  /// op id -> its output tensors by index
  std::map<int64_t, std::map<int64_t, const TensorRecord *>> OpOutputs;
  /// op id -> its outputs that have statistics (ekka-trace --op-stats),
  /// captured or not
  std::map<int64_t, std::vector<const TensorRecord *>> OpStatistics;
  /// op id -> the captured tensors it produced or wrote in place
  std::map<int64_t, std::vector<const TensorRecord *>> OpWrites;
  /// op id -> the kernels it launched, in launch order
  std::map<int64_t, std::vector<const KernelRecord *>> OpKernels;
  /// kernel id -> its captured buffer snapshots, by parameter
  std::map<int64_t, std::map<int64_t, const TensorRecord *>> Snapshots;
  /// op id -> its captured inputs (ekka-trace --capture-op-inputs), by index
  std::map<int64_t, std::map<int64_t, const TensorRecord *>> OpInputs;
  /// op id -> its captured in-place writes, by index
  std::map<int64_t, std::map<int64_t, const TensorRecord *>> OpMutated;
  std::vector<TensorRecord> Tensors;
  DenseMap<int64_t, const ModuleCallRecord *> CallById;
  DenseMap<int64_t, const TensorRecord *> TensorById;
  /// call id -> role -> index -> tensor
  std::map<int64_t, std::map<std::string, std::map<int64_t, const TensorRecord *>>> ByCall;
  /// (step, path, occurrence) -> call
  std::map<std::tuple<int64_t, std::string, unsigned>, const ModuleCallRecord *> ByKey;
  DenseMap<int64_t, std::tuple<int64_t, std::string, unsigned>> KeyOf;

  Error load(TraceReader &R);

  /// The stages of a pipeline-parallel run, first to last, as one trace:
  /// calls in the order the stages ran them, step by step. A module that
  /// several stages enter (the root, the decoder each stage runs a part of)
  /// is the last stage's call, which completes it; the earlier stages'
  /// calls of it are dropped, their children re-parented to it.
  Error loadStages(ArrayRef<TraceReader *> Readers);

  /// Reads one trace (stage \p Stage) into the side, its ids offset.
  Error append(TraceReader &R, int64_t Stage);

  Error index();

  const TensorRecord *tensor(int64_t Call, StringRef Role, int64_t Index) const;

  /// The values of a captured tensor, following the dataflow for an input
  /// that is an earlier output; a padded batch's without its padding.
  std::optional<std::vector<double>> values(const TensorRecord *T) const;

  /// The captured bytes of \p T as recorded (through the dataflow), when no
  /// padding is dropped from them; none otherwise.
  std::optional<StringRef> rawBytes(const TensorRecord *T) const {
    T = source(T);
    if (!T || T->Shard.empty() || Padded.count(T->Id))
      return std::nullopt;
    return shardBytes(*T);
  }

  /// Whether input \p X is the output \p Y (through the dataflow; for
  /// joined tensors, their first parts).
  bool sameTensor(const TensorRecord *X, const TensorRecord *Y) const {
    auto First = [&](const TensorRecord *Z) {
      auto J = Joined.find(Z->Id);
      return J == Joined.end() ? Z : J->second.first.front();
    };
    return X && Y && source(First(X)) == source(First(Y));
  }

  /// The record an input stands for: the earlier output it is.
  const TensorRecord *source(const TensorRecord *T) const {
    for (unsigned Hops = 0; T && T->SourceId && Hops < 4; ++Hops)
      T = TensorById.lookup(*T->SourceId);
    return T;
  }

  /// A captured tensor's bytes in its shard. A missing or corrupt shard
  /// must not turn into a quietly partial diagnosis: it is remembered, and
  /// the diagnosis fails with it.
  std::optional<StringRef> shardBytes(const TensorRecord &T) const;

  /// Whether a captured tensor's values \p V are the ones its statistics
  /// were computed from; a shard corrupted since is remembered as shardBytes
  /// remembers a missing one.
  bool matchesStats(const TensorRecord &T, llvm::ArrayRef<double> V) const;

  /// The same for a captured tensor's \p N values summed elsewhere (the
  /// bytes' comparison kernel) to \p Sum.
  bool matchesSum(const TensorRecord &T, double Sum, size_t N) const;
  /// Whether \p T's statistics can check its bytes at all: a CPU tensor's,
  /// finite, of a dtype summed as its values.
  static bool sumChecked(const TensorRecord &T);

  /// A batch padded to one length: the root was given token ids [batch,
  /// seq] and an attention mask of that shape, zeros marking the padding.
  /// Then every tensor that starts with [batch, seq] is seen as a serving
  /// engine lays a batch out, its real tokens sequence after sequence
  /// ([tokens, ...]): its Shape says so, values() drops the padding. Only
  /// the root's inputs of the first step tell; none found, nothing changes.
  void dropPadding();

  /// One forward step per request (ekka.reference runs each request so,
  /// teacher-forced): the steps joined into one, each call's tensors of
  /// every step concatenated along the tokens, request after request, as
  /// if the requests had been one forward's. Joins only where every later
  /// step ran the first step's calls; returns the number of steps joined
  /// (1: nothing done). Call after index().
  int64_t joinSteps();
  /// Joined tensors: their parts (each step's), and the dimension they
  /// were concatenated along.
  std::map<int64_t, std::pair<std::vector<const TensorRecord *>, int>> Joined;
  std::deque<TensorRecord> JoinedTensors;

  /// Tensors of a padded batch: their shapes as recorded.
  DenseMap<int64_t, Dims> Padded;
  Elements Mask;
  Dims MaskShape;

  mutable std::string Problem;
};

/// servedRequests of an indexed side (its first rank's).
llvm::Expected<std::vector<ServedRequest>> servedRequests(Side &S, int64_t VocabSize);

} // namespace detail
} // namespace ekka

#endif
