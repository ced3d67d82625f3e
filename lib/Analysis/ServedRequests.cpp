//===- ServedRequests.cpp - What each request of a served run consumed ----===//
#include "ekka/Analysis/ServedRequests.h"

#include "Side.h"

#include "ekka/Align/Transforms.h"
#include "ekka/Analysis/TensorMath.h"
#include "ekka/Support/Error.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/Twine.h"

#include <map>

using namespace llvm;

namespace ekka {

namespace {

/// One step's root: its token ids and positions, flattened.
struct StepInputs {
  int64_t Step = 0;
  std::vector<int64_t> Ids, Positions;
  /// Rows of the step's logits (0: none found).
  int64_t LogitsRows = 0;
};

std::vector<int64_t> integers(const std::vector<double> &V) {
  std::vector<int64_t> Out;
  Out.reserve(V.size());
  for (double X : V)
    Out.push_back(int64_t(X));
  return Out;
}

int64_t elements(const Dims &Shape) {
  int64_t N = 1;
  for (int64_t D : Shape)
    N *= D;
  return N;
}

Expected<std::vector<StepInputs>> stepInputs(detail::Side &S, int64_t VocabSize) {
  std::map<int64_t, StepInputs> ByStep;
  std::map<int64_t, const ModuleCallRecord *> Root;
  for (const ModuleCallRecord &M : S.Calls)
    if (!M.ParentId && !Root.count(M.Step))
      Root[M.Step] = &M;
  for (auto [Step, M] : Root) {
    const TensorRecord *Ids = nullptr, *Positions = nullptr;
    for (int64_t I = 0; const TensorRecord *X = S.tensor(M->Id, "input", I); ++I) {
      if (unitRoundoff(X->Type) != 0 || X->Shape.empty())
        continue;
      if (!Ids)
        Ids = X;
      else if (!Positions && elements(X->Shape) == elements(Ids->Shape))
        Positions = X;
    }
    std::string Where = "step " + std::to_string(Step) + "'s root (" +
                        (M->Path.empty() ? M->ClassName : M->Path) + ")";
    if (!Ids)
      return makeError(Where + " was given no token ids: the trace does not show what the "
                               "requests consumed");
    if (!Positions)
      return makeError(Where + " was given no positions beside its token ids: the trace does "
                               "not show which request each token belongs to (a serving "
                               "engine passes them; give --reference instead)");
    auto IdValues = S.values(Ids);
    auto PosValues = S.values(Positions);
    if (!IdValues || !PosValues)
      return makeError(Where + ": its token ids or positions were not captured");
    StepInputs &In = ByStep[Step];
    In.Step = Step;
    In.Ids = integers(*IdValues);
    In.Positions = integers(*PosValues);
  }
  if (VocabSize > 0)
    for (const ModuleCallRecord &M : S.Calls) {
      auto It = ByStep.find(M.Step);
      const TensorRecord *Out = S.tensor(M.Id, "output", 0);
      if (It == ByStep.end() || !Out || Out->Shape.size() < 2 || unitRoundoff(Out->Type) == 0 ||
          Out->Shape.back() != VocabSize)
        continue;
      It->second.LogitsRows = elements(Out->Shape) / VocabSize; // the step's last such call
    }
  std::vector<StepInputs> Out;
  for (auto &[Step, In] : ByStep)
    Out.push_back(std::move(In));
  return Out;
}

} // namespace

Expected<std::vector<ServedRequest>> servedRequests(ArrayRef<TraceReader *> Ranks,
                                                    int64_t VocabSize) {
  if (Ranks.empty())
    return makeError("the target trace has no rank");
  detail::Side S;
  if (Error E = S.load(*Ranks.front()))
    return E;
  return detail::servedRequests(S, VocabSize);
}

Expected<std::vector<ServedRequest>> detail::servedRequests(Side &S, int64_t VocabSize) {
  auto Steps = stepInputs(S, VocabSize);
  if (!Steps)
    return Steps.takeError();
  if (Steps->empty())
    return makeError("the target trace has no forward step");
  std::vector<ServedRequest> Requests;
  // The position each request expects next, for the ones still served.
  std::vector<std::pair<size_t, int64_t>> Expecting;
  for (const StepInputs &In : *Steps) {
    // The step's segments: runs of positions counting up by one.
    std::vector<std::pair<size_t, size_t>> Segments; // [begin, end)
    for (size_t I = 0; I < In.Positions.size(); ++I)
      if (I == 0 || In.Positions[I] != In.Positions[I - 1] + 1)
        Segments.emplace_back(I, I + 1);
      else
        Segments.back().second = I + 1;
    bool LastRowsOnly = In.LogitsRows == int64_t(Segments.size()) &&
                        In.LogitsRows != int64_t(In.Positions.size());
    // Logits of another count: two requests whose positions run on (one at
    // 5, the next at 6) read as one sequence.
    if (In.LogitsRows > 0 && !LastRowsOnly && In.LogitsRows != int64_t(In.Positions.size()))
      return makeError("step " + Twine(In.Step) + " computed " + Twine(In.LogitsRows) +
                       " rows of logits for " + Twine(Segments.size()) +
                       " runs of positions: the trace does not show which tokens are which "
                       "request's");
    std::map<int64_t, int64_t> StartingAt; // this step's segments by first position
    for (auto [Begin, End] : Segments)
      ++StartingAt[In.Positions[Begin]];
    std::vector<bool> Taken(Expecting.size(), false);
    for (size_t SegIndex = 0; SegIndex < Segments.size(); ++SegIndex) {
      auto [Begin, End] = Segments[SegIndex];
      int64_t First = In.Positions[Begin];
      std::string Where = "step " + std::to_string(In.Step) + ", token " + std::to_string(Begin);
      size_t Req = Requests.size();
      if (First > 0) {
        // More requests expect this position than this step continues: a
        // request that ended, or one not scheduled now. Which one goes on
        // matters only where their tokens differ.
        std::vector<size_t> Candidates;
        for (size_t K = 0; K < Expecting.size(); ++K)
          if (!Taken[K] && Expecting[K].second == First)
            Candidates.push_back(K);
        if (int64_t(Candidates.size()) > StartingAt[First])
          for (size_t K : Candidates)
            if (Requests[Expecting[K].first].Tokens !=
                Requests[Expecting[Candidates.front()].first].Tokens)
              return makeError(Where + " continues one of " + Twine(Candidates.size()) +
                               " requests at position " + Twine(First) +
                               ", and the trace does not show which");
        --StartingAt[First];
        if (!Candidates.empty()) {
          Req = Expecting[Candidates.front()].first;
          Taken[Candidates.front()] = true;
        }
      }
      if (Req == Requests.size()) {
        ServedRequest New;
        New.Start = First;
        if (First > 0) {
          // Its first positions came from the cache: an earlier request's
          // tokens, the same in every one that has as many.
          const ServedRequest *Prefix = nullptr;
          for (const ServedRequest &R : Requests) {
            if (int64_t(R.Tokens.size()) < First)
              continue;
            if (Prefix && !std::equal(R.Tokens.begin(), R.Tokens.begin() + First,
                                      Prefix->Tokens.begin()))
              return makeError(Where + " begins a request at position " + Twine(First) +
                               ", its first positions from the cache, but earlier requests "
                               "disagree on what they held: the trace does not show which "
                               "prefix it reused");
            Prefix = &R;
          }
          if (!Prefix)
            return makeError(Where + " continues a sequence at position " + Twine(First) +
                             " that no earlier step began: the trace does not hold its "
                             "first tokens (was it traced from its start?)");
          New.Tokens.assign(Prefix->Tokens.begin(), Prefix->Tokens.begin() + First);
        }
        Requests.push_back(std::move(New));
        Expecting.emplace_back(Req, First);
        Taken.push_back(true);
      }
      ServedRequest &R = Requests[Req];
      R.Segments.push_back({In.Step, int64_t(Begin), int64_t(End), int64_t(SegIndex)});
      R.Tokens.insert(R.Tokens.end(), In.Ids.begin() + Begin, In.Ids.begin() + End);
      int64_t Last = In.Positions[End - 1];
      if (LastRowsOnly)
        R.LogitsPositions.push_back(Last);
      else
        for (size_t I = Begin; I < End; ++I)
          R.LogitsPositions.push_back(In.Positions[I]);
      for (auto &[K, Next] : Expecting)
        if (K == Req)
          Next = Last + 1;
    }
  }
  return Requests;
}

json::Value requestsJSON(ArrayRef<ServedRequest> Requests) {
  json::Array Out;
  for (const ServedRequest &R : Requests) {
    json::Array Tokens, Logits;
    for (int64_t T : R.Tokens)
      Tokens.push_back(T);
    for (int64_t P : R.LogitsPositions)
      Logits.push_back(P);
    Out.push_back(json::Object{
        {"tokens", std::move(Tokens)}, {"start", R.Start}, {"logits_positions", std::move(Logits)}});
  }
  return json::Object{{"requests", std::move(Out)}};
}

} // namespace ekka
