//===- Transforms.h - The closed set of activation transforms -*- C++ -*-===//
//
// What ekka-diagnose may do to two implementations' tensors to make them
// comparable: relabel shapes (squeeze a batch of one, reshape heads, flatten
// batch x sequence into tokens), move elements (transpose, concatenate,
// split, gather tensor-parallel shards, un-page a KV cache, drop padding),
// and cast (every value is widened to double). Nothing here computes: each
// transform only selects and reorders elements, so no transform can
// explain a real difference away. The set is closed on purpose
// (docs/Diagnose.md, "Alignment").
//
// Tensors are row-major; a shape is its dimensions, outermost first.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_ALIGN_TRANSFORMS_H
#define EKKA_ALIGN_TRANSFORMS_H

#include "ekka/Support/TensorDims.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ekka {

/// A shape, inline up to six dimensions, as a trace's tensor records hold it.
using Dims = TensorDims;
using Elements = std::vector<double>;

/// The number of elements of \p S (1 for a scalar).
int64_t numElements(llvm::ArrayRef<int64_t> S);

/// \p S without its leading dimensions of one (a batch of one sequence);
/// a shape of ones keeps its last.
Dims squeezeLeading(Dims S);

/// A tensor's shape as [tokens, features]: leading ones squeezed, the first
/// dimension the tokens, the rest multiplied. A serving engine's
/// [tokens, heads * head_dim] is HuggingFace's [1, tokens, heads, head_dim]
/// so (a head reshape: the same elements in the same order).
Dims tokenMajor(Dims S);

/// \p S as [rows, Features], its trailing dimensions multiplied up to
/// \p Features (a decode step's single token stays a row); empty when they
/// do not make exactly that.
Dims rowsOf(llvm::ArrayRef<int64_t> S, int64_t Features);

/// Whether two shapes have the same features per token: the same last
/// dimension ([tokens, hidden] and [batch, seq, hidden]), or one's last
/// dimension the product of the other's trailing ones, never its first (a
/// head reshape: [tokens, heads * dim] and [1, tokens, heads, dim]).
bool sameFeatures(Dims A, Dims B);

/// Concatenates tensors along \p Dim (negative counts from the end); none
/// if their shapes do not allow it.
std::optional<Elements> concatenate(llvm::ArrayRef<Elements> Parts, llvm::ArrayRef<Dims> Shapes,
                                  int Dim);

/// Splits a tensor of shape \p S along \p Dim into parts of \p Sizes along
/// it (which must add up to that dimension); none otherwise. The inverse of
/// concatenate.
std::optional<std::vector<Elements>> split(const Elements &V, llvm::ArrayRef<int64_t> S, int Dim,
                                         llvm::ArrayRef<int64_t> Sizes);

/// Swaps dimensions \p A and \p B (negative counts from the end) of a
/// tensor of shape \p S; its new shape in \p Out if given. None when a
/// dimension is out of range or the values do not fill the shape.
std::optional<Elements> transpose(const Elements &V, llvm::ArrayRef<int64_t> S, int A, int B,
                                Dims *Out = nullptr);

/// The one swap of two dimensions that turns shape \p From into \p To
/// (leading ones squeezed on both, as dimensions of the squeezed \p From):
/// none when the shapes already agree (also as [tokens, features]) or when
/// no swap does it.
std::optional<std::pair<int, int>> transposition(Dims From, Dims To);

/// Every swap of two dimensions the shapes allow between \p From and \p To
/// (leading ones squeezed on both): the swaps that turn the squeezed
/// \p From into \p To, and, when the two already agree, the swaps of two
/// dimensions of equal extent ([T, H, D] against [H, T, D] with T == H
/// look alike). Two shapes that differ are explained by at most one swap
/// (transposition()'s answer). Swaps listed for shapes that agree leave the
/// layout open: only the values can tell (the bounded search in
/// ekka-diagnose).
std::vector<std::pair<int, int>> transpositions(Dims From, Dims To);

/// The one swap of two dimensions (of the full shape \p S) that recorded
/// strides \p Strides show: a transposed view, its memory holding those two
/// dimensions the other way round (HF's `.transpose(1, 2)` of
/// [1, tokens, heads, dim]). None for a tensor laid out in order, for
/// dimensions of extent 1, or for any other permutation.
std::optional<std::pair<int, int>> viewSwap(llvm::ArrayRef<int64_t> S,
                                            llvm::ArrayRef<int64_t> Strides);

/// Gathers one tensor from the tensor-parallel ranks' shards (\p Ranks,
/// rank after rank, each [tokens, Local]): each token's features, rank after
/// rank. With \p Parts (the features of the parts of a fused tensor, such as
/// q, k and v of a fused QKV projection), each rank holds its share of every
/// part, and the gathered row is regrouped part by part. None when the
/// shards do not divide so.
std::optional<Elements> gatherShards(llvm::ArrayRef<Elements> Ranks, int64_t Local,
                                   llvm::ArrayRef<int64_t> Parts = {});

/// Drops the padding of a batch: a tensor of shape \p S = [batch, seq, ...]
/// and the attention mask [batch, seq] (non-zero: a real token) give the
/// real tokens, sequence after sequence, as a serving engine lays a batch
/// out ([tokens, ...]). None when the mask does not fit the shape.
std::optional<Elements> unpad(const Elements &V, llvm::ArrayRef<int64_t> S, const Elements &Mask,
                            llvm::ArrayRef<int64_t> MaskShape);

/// Un-pages a KV cache: \p Cache of shape [blocks, block_size, ...] and the
/// slot of each token (block * block_size + offset, as vLLM's slot
/// mapping) give the tokens' entries in order, [tokens, ...]; a negative
/// slot (a padding token, which vLLM does not cache) is skipped. None when
/// a slot is past the cache.
std::optional<Elements> unpage(const Elements &Cache, llvm::ArrayRef<int64_t> CacheShape,
                             llvm::ArrayRef<int64_t> Slots);

/// The same over a cache's captured bytes, \p ElementSize bytes an element:
/// only the slots' rows are read (a cache is large), and the tokens' entries
/// come back as bytes, in order.
std::optional<std::string> unpageBytes(llvm::StringRef Cache, llvm::ArrayRef<int64_t> CacheShape,
                                       size_t ElementSize, llvm::ArrayRef<int64_t> Slots);

} // namespace ekka

#endif
