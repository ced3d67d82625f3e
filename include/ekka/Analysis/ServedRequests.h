//===- ServedRequests.h - What each request of a served run consumed -*- C++ -*-===//
//
// The token ids each request of a serving engine's run consumed, read back
// from its trace: what a reference must be fed, teacher-forced, to compute
// what the engine computed (`ekka-diagnose --reference-model`). It reads
// the trace's roots only: their token ids and positions, step by step. It
// does not run anything, and knows nothing of any engine's classes.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_ANALYSIS_SERVEDREQUESTS_H
#define EKKA_ANALYSIS_SERVEDREQUESTS_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <cstdint>
#include <vector>

namespace ekka {

class TraceReader;

/// One request as the engine served it.
struct ServedRequest {
  /// Every token the engine fed the model for it, in order of position:
  /// its prompt, then the tokens it generated and fed back (the last one
  /// generated is never fed).
  std::vector<int64_t> Tokens;
  /// The first position the engine computed: a prefix taken from its
  /// cache (prefix caching) was not computed in any traced step.
  int64_t Start = 0;
  /// The positions whose logits the engine computed (a serving engine
  /// computes each scheduled sequence's last row only); empty: all.
  std::vector<int64_t> LogitsPositions;
  /// Its segments, in order: the rows [Begin, End) of a step's tokens, and
  /// which of that step's segments it is (its logits' row where the
  /// engine computed each segment's last row only).
  struct Segment {
    int64_t Step = 0, Begin = 0, End = 0, IndexInStep = 0;
  };
  std::vector<Segment> Segments;
};

/// The requests of a traced run, in order of their first token. A step's
/// root was given token ids and positions (a serving engine's flattened
/// batch: `input_ids [tokens]`, `positions [tokens]`); a run of positions
/// that counts up by one is one request's segment. Position 0 begins a
/// request; a later position continues the request that expects it (the
/// one earliest in the batch, as an engine keeps its batch in order), or,
/// when none does, begins one whose first positions came from the cache:
/// their tokens are an earlier request's, which must be the only one, or
/// all alike. \p VocabSize, when known, tells which call holds the logits
/// (its output's last extent) and so whether they are each segment's last
/// row only. An error names what the trace does not show.
llvm::Expected<std::vector<ServedRequest>> servedRequests(llvm::ArrayRef<TraceReader *> Ranks,
                                                          int64_t VocabSize);

/// {"requests": [{"tokens": [...], "start": N, "logits_positions": [...]}]}:
/// what `python -m ekka.reference --requests FILE` reads.
llvm::json::Value requestsJSON(llvm::ArrayRef<ServedRequest> Requests);

} // namespace ekka

#endif
