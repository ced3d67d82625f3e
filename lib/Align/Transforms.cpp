//===- Transforms.cpp - The closed set of activation transforms -----------===//
#include "ekka/Align/Transforms.h"

#include <algorithm>

using namespace llvm;

namespace ekka {

int64_t numElements(ArrayRef<int64_t> S) {
  int64_t N = 1;
  for (int64_t D : S)
    N *= D;
  return N;
}

Dims squeezeLeading(Dims S) {
  size_t Ones = 0;
  while (Ones + 1 < S.size() && S[Ones] == 1)
    ++Ones;
  S.erase(S.begin(), S.begin() + Ones);
  return S;
}

Dims tokenMajor(Dims S) {
  S = squeezeLeading(std::move(S));
  if (S.size() <= 2)
    return S;
  return {S[0], numElements(ArrayRef<int64_t>(S).drop_front())};
}

Dims rowsOf(ArrayRef<int64_t> S, int64_t Features) {
  if (Features <= 0)
    return {};
  int64_t Trailing = 1;
  size_t I = S.size();
  do {
    if (I == 0)
      return {};
    Trailing *= S[--I];
  } while (Trailing < Features);
  if (Trailing != Features)
    return {};
  return {numElements(S.take_front(I)), Features};
}

bool sameFeatures(Dims A, Dims B) {
  A = squeezeLeading(std::move(A));
  B = squeezeLeading(std::move(B));
  if (A.empty() || B.empty() || A.back() == B.back())
    return true;
  auto Trailing = [](const Dims &S, int64_t Features) {
    int64_t P = 1;
    for (size_t I = S.size(); I > 1 && P < Features;)
      P *= S[--I];
    return P == Features;
  };
  return Trailing(B, A.back()) || Trailing(A, B.back());
}

/// \p Dim of a tensor of \p Rank dimensions, negative counting from the
/// end; none when out of range.
static std::optional<size_t> dimIndex(int Dim, size_t Rank) {
  int64_t D = Dim < 0 ? int64_t(Rank) + Dim : Dim;
  if (D < 0 || D >= int64_t(Rank))
    return std::nullopt;
  return size_t(D);
}

std::optional<Elements> concatenate(ArrayRef<Elements> Parts, ArrayRef<Dims> Shapes, int Dim) {
  if (Parts.empty() || Parts.size() != Shapes.size())
    return std::nullopt;
  size_t Rank = Shapes[0].size();
  auto D = dimIndex(Dim, Rank);
  if (!D)
    return std::nullopt;
  int64_t Outer = numElements(ArrayRef<int64_t>(Shapes[0]).take_front(*D));
  std::vector<int64_t> Inner(Parts.size());
  size_t Total = 0;
  for (size_t K = 0; K < Parts.size(); ++K) {
    if (Shapes[K].size() != Rank)
      return std::nullopt;
    // Every dimension but the joined one agrees.
    for (size_t I = 0; I < Rank; ++I)
      if (I != *D && Shapes[K][I] != Shapes[0][I])
        return std::nullopt;
    Inner[K] = numElements(ArrayRef<int64_t>(Shapes[K]).drop_front(*D));
    if (int64_t(Parts[K].size()) != Outer * Inner[K])
      return std::nullopt;
    Total += Parts[K].size();
  }
  Elements Out;
  Out.reserve(Total);
  for (int64_t O = 0; O < Outer; ++O)
    for (size_t K = 0; K < Parts.size(); ++K)
      Out.insert(Out.end(), Parts[K].begin() + O * Inner[K], Parts[K].begin() + (O + 1) * Inner[K]);
  return Out;
}

std::optional<std::vector<Elements>> split(const Elements &V, ArrayRef<int64_t> S, int Dim,
                                           ArrayRef<int64_t> Sizes) {
  auto D = dimIndex(Dim, S.size());
  if (!D || int64_t(V.size()) != numElements(S) || Sizes.empty())
    return std::nullopt;
  int64_t Sum = 0;
  for (int64_t N : Sizes) {
    if (N < 0)
      return std::nullopt;
    Sum += N;
  }
  if (Sum != S[*D])
    return std::nullopt;
  int64_t Outer = numElements(S.take_front(*D)), After = numElements(S.drop_front(*D + 1));
  std::vector<Elements> Out(Sizes.size());
  for (size_t K = 0; K < Sizes.size(); ++K)
    Out[K].reserve(size_t(Outer * Sizes[K] * After));
  for (int64_t O = 0; O < Outer; ++O) {
    auto Row = V.begin() + O * S[*D] * After;
    for (size_t K = 0; K < Sizes.size(); ++K) {
      Out[K].insert(Out[K].end(), Row, Row + Sizes[K] * After);
      Row += Sizes[K] * After;
    }
  }
  return Out;
}

std::optional<Elements> transpose(const Elements &V, ArrayRef<int64_t> S, int A, int B,
                                  Dims *Out) {
  auto DA = dimIndex(A, S.size()), DB = dimIndex(B, S.size());
  if (!DA || !DB || int64_t(V.size()) != numElements(S))
    return std::nullopt;
  Dims To(S.begin(), S.end());
  std::swap(To[*DA], To[*DB]);
  if (Out)
    *Out = To;
  if (*DA == *DB)
    return V;
  size_t Lo = std::min(*DA, *DB), Hi = std::max(*DA, *DB);
  // [Outer, S[Lo], Middle, S[Hi], Inner] -> [Outer, S[Hi], Middle, S[Lo], Inner]
  int64_t Outer = numElements(S.take_front(Lo)), Middle = numElements(S.slice(Lo + 1, Hi - Lo - 1)),
          Inner = numElements(S.drop_front(Hi + 1)), NL = S[Lo], NH = S[Hi];
  Elements R(V.size());
  size_t W = 0;
  for (int64_t O = 0; O < Outer; ++O)
    for (int64_t H = 0; H < NH; ++H)
      for (int64_t M = 0; M < Middle; ++M)
        for (int64_t L = 0; L < NL; ++L) {
          auto From = V.begin() + (((O * NL + L) * Middle + M) * NH + H) * Inner;
          std::copy(From, From + Inner, R.begin() + W);
          W += size_t(Inner);
        }
  return R;
}

std::vector<std::pair<int, int>> transpositions(Dims From, Dims To) {
  From = squeezeLeading(std::move(From));
  To = squeezeLeading(std::move(To));
  std::vector<std::pair<int, int>> Out;
  if (From.size() != To.size())
    return Out;
  for (size_t I = 0; I < From.size(); ++I)
    for (size_t J = I + 1; J < From.size(); ++J) {
      Dims S = From;
      std::swap(S[I], S[J]);
      if (S == To)
        Out.emplace_back(int(I), int(J));
    }
  return Out;
}

std::optional<std::pair<int, int>> viewSwap(ArrayRef<int64_t> S, ArrayRef<int64_t> Strides) {
  if (S.size() != Strides.size())
    return std::nullopt;
  // The dimensions that matter, in memory order (largest stride first).
  std::vector<size_t> Dim;
  for (size_t I = 0; I < S.size(); ++I)
    if (S[I] > 1)
      Dim.push_back(I);
  std::vector<size_t> Memory = Dim;
  std::stable_sort(Memory.begin(), Memory.end(),
                   [&](size_t A, size_t B) { return Strides[A] > Strides[B]; });
  std::vector<size_t> Out;
  for (size_t K = 0; K < Dim.size(); ++K)
    if (Memory[K] != Dim[K])
      Out.push_back(K);
  if (Out.size() != 2 || Memory[Out[0]] != Dim[Out[1]] || Memory[Out[1]] != Dim[Out[0]])
    return std::nullopt;
  return std::make_pair(int(Dim[Out[0]]), int(Dim[Out[1]]));
}

std::optional<std::pair<int, int>> transposition(Dims From, Dims To) {
  if (squeezeLeading(From) == squeezeLeading(To) || tokenMajor(From) == tokenMajor(To))
    return std::nullopt;
  auto All = transpositions(std::move(From), std::move(To));
  if (All.empty())
    return std::nullopt;
  return All.front(); // the only one: shapes that differ allow at most one

}

std::optional<Elements> gatherShards(ArrayRef<Elements> Ranks, int64_t Local,
                                     ArrayRef<int64_t> Parts) {
  if (Ranks.empty() || Local <= 0 || Ranks[0].size() % size_t(Local))
    return std::nullopt;
  int64_t N = int64_t(Ranks.size());
  for (const Elements &R : Ranks)
    if (R.size() != Ranks[0].size())
      return std::nullopt;
  // Without parts, the whole row is one part.
  std::vector<int64_t> Groups(Parts.begin(), Parts.end());
  if (Groups.empty())
    Groups.push_back(Local * N);
  int64_t Total = 0;
  for (int64_t P : Groups) {
    if (P <= 0 || P % N)
      return std::nullopt;
    Total += P;
  }
  if (Total != Local * N)
    return std::nullopt;
  size_t Tokens = Ranks[0].size() / size_t(Local);
  Elements Out;
  Out.reserve(Tokens * size_t(Total));
  for (size_t Tok = 0; Tok < Tokens; ++Tok) {
    int64_t Offset = 0; // within a rank's row
    for (int64_t P : Groups) {
      int64_t Share = P / N;
      for (const Elements &Rank : Ranks) {
        auto Row = Rank.begin() + Tok * size_t(Local) + Offset;
        Out.insert(Out.end(), Row, Row + Share);
      }
      Offset += Share;
    }
  }
  return Out;
}

std::optional<Elements> unpad(const Elements &V, ArrayRef<int64_t> S, const Elements &Mask,
                              ArrayRef<int64_t> MaskShape) {
  Dims M = squeezeLeading(Dims(MaskShape.begin(), MaskShape.end()));
  if (M.size() == 1 && MaskShape.size() == 2)
    M.insert(M.begin(), 1); // a batch of one
  if (M.size() != 2 || S.size() < 2 || S[0] != M[0] || S[1] != M[1] ||
      int64_t(Mask.size()) != M[0] * M[1] || int64_t(V.size()) != numElements(S))
    return std::nullopt;
  int64_t Row = numElements(S.drop_front(2));
  Elements Out;
  for (size_t T = 0; T < Mask.size(); ++T)
    if (Mask[T] != 0)
      Out.insert(Out.end(), V.begin() + T * Row, V.begin() + (T + 1) * Row);
  return Out;
}

/// Un-pages rows of \p RowSize units (elements, or bytes) from \p Cache,
/// appending each slot's row to \p Out.
template <typename Range, typename Out>
static bool unpageRows(const Range &Cache, ArrayRef<int64_t> CacheShape, size_t RowSize,
                       ArrayRef<int64_t> Slots, Out &Rows) {
  int64_t Capacity = CacheShape[0] * CacheShape[1];
  for (int64_t Slot : Slots) {
    if (Slot < 0)
      continue; // a padding token (vLLM's slot -1): nothing was cached
    if (Slot >= Capacity || (size_t(Slot) + 1) * RowSize > size_t(Cache.size()))
      return false;
    Rows.insert(Rows.end(), Cache.begin() + size_t(Slot) * RowSize,
                Cache.begin() + (size_t(Slot) + 1) * RowSize);
  }
  return true;
}

std::optional<Elements> unpage(const Elements &Cache, ArrayRef<int64_t> CacheShape,
                               ArrayRef<int64_t> Slots) {
  if (CacheShape.size() < 2 || int64_t(Cache.size()) != numElements(CacheShape))
    return std::nullopt;
  Elements Out;
  size_t Row = size_t(numElements(CacheShape.drop_front(2)));
  Out.reserve(Slots.size() * Row);
  if (!unpageRows(Cache, CacheShape, Row, Slots, Out))
    return std::nullopt;
  return Out;
}

std::optional<std::string> unpageBytes(StringRef Cache, ArrayRef<int64_t> CacheShape,
                                       size_t ElementSize, ArrayRef<int64_t> Slots) {
  if (CacheShape.size() < 2 || Cache.size() != size_t(numElements(CacheShape)) * ElementSize)
    return std::nullopt;
  std::string Out;
  size_t Row = size_t(numElements(CacheShape.drop_front(2))) * ElementSize;
  Out.reserve(Slots.size() * Row);
  if (!unpageRows(Cache, CacheShape, Row, Slots, Out))
    return std::nullopt;
  return Out;
}

} // namespace ekka
