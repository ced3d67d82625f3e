//===- TransformsTest.cpp - Each alignment transform, on small tensors -----===//
#include "ekka/Align/Mapping.h"
#include "ekka/Align/Transforms.h"

#include "llvm/ADT/STLExtras.h"

#include <gtest/gtest.h>
#include <numeric>

using namespace ekka;

namespace {

/// 0, 1, 2, ... as a tensor of \p S.
Elements iota(const Dims &S) {
  Elements V(size_t(numElements(S)));
  std::iota(V.begin(), V.end(), 0.0);
  return V;
}

TEST(Transforms, SqueezeAndHeadReshapeRelabelShapes) {
  EXPECT_EQ(squeezeLeading({1, 1, 5, 8}), (Dims{5, 8}));
  EXPECT_EQ(squeezeLeading({1, 1}), (Dims{1}));
  EXPECT_EQ(squeezeLeading({2, 5}), (Dims{2, 5}));
  // HF's [1, tokens, heads, dim] is an engine's [tokens, heads * dim].
  EXPECT_EQ(tokenMajor({1, 7, 4, 16}), (Dims{7, 64}));
  EXPECT_EQ(tokenMajor({7, 64}), (Dims{7, 64}));
  // A decode step's one token stays a row; features that the trailing
  // dimensions cannot make exactly give nothing.
  EXPECT_EQ(rowsOf({1, 4, 16}, 64), (Dims{1, 64}));
  EXPECT_EQ(rowsOf({3, 4, 16}, 16), (Dims{12, 16}));
  EXPECT_TRUE(rowsOf({3, 4, 16}, 24).empty());
  EXPECT_TRUE(rowsOf({3, 4, 16}, 0).empty());
  EXPECT_TRUE(sameFeatures({7, 64}, {1, 7, 4, 16}));
  EXPECT_TRUE(sameFeatures({7, 64}, {2, 9, 64}));
  // SiluAndMul's [tokens, 2 * inter] is not HF's act_fn's [1, tokens, inter];
  // and the token dimension never makes the features.
  EXPECT_FALSE(sameFeatures({7, 256}, {1, 7, 128}));
  EXPECT_FALSE(sameFeatures({7, 448}, {1, 7, 64}));
}

TEST(Transforms, ConcatenateAndSplitAreInverses) {
  // q [2, 4] and kv [2, 2] along the features: each row q then kv.
  Elements Q = iota({2, 4}), KV = {100, 101, 102, 103};
  auto Fused = concatenate({Q, KV}, {{2, 4}, {2, 2}}, -1);
  ASSERT_TRUE(Fused);
  EXPECT_EQ(*Fused, (Elements{0, 1, 2, 3, 100, 101, 4, 5, 6, 7, 102, 103}));
  auto Parts = split(*Fused, {2, 6}, 1, {4, 2});
  ASSERT_TRUE(Parts);
  ASSERT_EQ(Parts->size(), 2u);
  EXPECT_EQ((*Parts)[0], Q);
  EXPECT_EQ((*Parts)[1], KV);
  // Along the first dimension: one after the other.
  auto Rows = concatenate({Q, KV}, {{2, 4}, {1, 4}}, 0);
  ASSERT_TRUE(Rows);
  EXPECT_EQ(Rows->size(), 12u);
  EXPECT_EQ((*Rows)[8], 100);
  // Shapes that do not allow it.
  EXPECT_FALSE(concatenate({Q, KV}, {{2, 4}, {1, 2}}, -1));
  // [2, 3] and [2, 4] do not join along the first dimension, though the
  // element counts would.
  EXPECT_FALSE(concatenate({iota({2, 3}), iota({2, 4})}, {{2, 3}, {2, 4}}, 0));
  EXPECT_FALSE(concatenate({Q}, {{2, 4}}, 2));
  EXPECT_FALSE(split(*Fused, {2, 6}, 1, {4, 3}));
  EXPECT_FALSE(split(*Fused, {2, 6}, 2, {6}));
}

TEST(Transforms, TransposeSwapsTwoDimensions) {
  // [2, 3] -> [3, 2]
  Dims S;
  auto T = transpose(iota({2, 3}), {2, 3}, 0, 1, &S);
  ASSERT_TRUE(T);
  EXPECT_EQ(S, (Dims{3, 2}));
  EXPECT_EQ(*T, (Elements{0, 3, 1, 4, 2, 5}));
  // HF's attention internals, [batch, heads, seq, dim] -> [batch, seq,
  // heads, dim]: element (b, h, s, d) lands at (b, s, h, d).
  Dims From = {1, 2, 3, 4};
  Elements V = iota(From);
  auto U = transpose(V, From, 1, 2, &S);
  ASSERT_TRUE(U);
  EXPECT_EQ(S, (Dims{1, 3, 2, 4}));
  for (int64_t H = 0; H < 2; ++H)
    for (int64_t Sq = 0; Sq < 3; ++Sq)
      for (int64_t D = 0; D < 4; ++D)
        EXPECT_EQ((*U)[size_t((Sq * 2 + H) * 4 + D)], V[size_t((H * 3 + Sq) * 4 + D)]);
  // Swapping back is the identity; dims that are not adjacent work too.
  EXPECT_EQ(*transpose(*U, S, 2, 1), V);
  auto W = transpose(V, From, -1, 1, &S);
  ASSERT_TRUE(W);
  EXPECT_EQ(S, (Dims{1, 4, 3, 2}));
  EXPECT_EQ(*transpose(*W, S, 1, 3), V);
  EXPECT_FALSE(transpose(V, From, 0, 4));
  EXPECT_FALSE(transpose(Elements{1, 2}, From, 0, 1));
}

TEST(Transforms, TranspositionIsChosenOnlyWhenTheShapesLeaveOne) {
  // [tokens, heads, dim] against HF's [1, heads, tokens, dim].
  auto Swap = transposition({5, 4, 16}, {1, 4, 5, 16});
  ASSERT_TRUE(Swap);
  EXPECT_EQ(*Swap, std::make_pair(0, 1));
  // Already alike, also as [tokens, features]: nothing to swap.
  EXPECT_FALSE(transposition({5, 4, 16}, {1, 5, 4, 16}));
  EXPECT_FALSE(transposition({5, 64}, {1, 5, 4, 16}));
  EXPECT_EQ(transposition({2, 4, 4}, {4, 4, 2}), std::make_pair(0, 2));
  // No single swap makes it; equal shapes are taken as they are.
  EXPECT_FALSE(transposition({5, 4, 16}, {16, 5, 4}));
  EXPECT_FALSE(transposition({4, 4}, {4, 4}));
}

TEST(Transforms, TranspositionsListWhatTheShapesLeaveOpen) {
  using Swaps = std::vector<std::pair<int, int>>;
  // Tokens and heads of one extent: as is, or swapped.
  EXPECT_EQ(transpositions({4, 4, 16}, {1, 4, 4, 16}), (Swaps{{0, 1}}));
  // All three alike.
  EXPECT_EQ(transpositions({4, 4, 4}, {4, 4, 4}), (Swaps{{0, 1}, {0, 2}, {1, 2}}));
  // Different shapes, one swap: the shapes decide (transposition()).
  EXPECT_EQ(transpositions({5, 4, 16}, {1, 4, 5, 16}), (Swaps{{0, 1}}));
  // Different shapes: at most one swap explains them (two that did would
  // both have to move the same two dimensions), also with repeated extents.
  EXPECT_EQ(transpositions({2, 2, 8, 2}, {2, 8, 2, 2}), (Swaps{{1, 2}}));
  EXPECT_EQ(transpositions({8, 2, 2}, {2, 8, 2}), (Swaps{{0, 1}}));
  // No choice at all.
  EXPECT_TRUE(transpositions({5, 4, 16}, {1, 5, 4, 16}).empty());
  EXPECT_TRUE(transpositions({5, 4}, {4, 5, 1}).empty());
}

TEST(Transforms, AViewsStridesShowItsMemoryOrder) {
  using Swap = std::optional<std::pair<int, int>>;
  // HF's q.view(1, T, H, D).transpose(1, 2): [1, H=4, T=37, D=16].
  EXPECT_EQ(viewSwap({1, 4, 37, 16}, {2368, 16, 64, 1}), (Swap{{1, 2}}));
  // In order, or no strides: nothing to swap.
  EXPECT_EQ(viewSwap({1, 4, 37, 16}, {2368, 592, 16, 1}), Swap());
  EXPECT_EQ(viewSwap({4, 37}, {}), Swap());
  // A dimension of extent 1 does not count, wherever its stride.
  EXPECT_EQ(viewSwap({4, 1, 37}, {1, 999, 4}), (Swap{{0, 2}}));
  // Another permutation than one swap (a rotation of three): none.
  EXPECT_EQ(viewSwap({2, 3, 4}, {1, 8, 2}), Swap());
}

TEST(Transforms, GatherShardsPutsEachTokensFeaturesRankAfterRank) {
  // Two tokens, two ranks with two features each.
  Elements R0 = {0, 1, 10, 11}, R1 = {2, 3, 12, 13};
  auto G = gatherShards({R0, R1}, 2);
  ASSERT_TRUE(G);
  EXPECT_EQ(*G, (Elements{0, 1, 2, 3, 10, 11, 12, 13}));
  // A fused QKV of parts q (4 features) and k (2 features): each rank holds
  // half of q and half of k.
  Elements S0 = {0, 1, 4}, S1 = {2, 3, 5};
  auto P = gatherShards({S0, S1}, 3, {4, 2});
  ASSERT_TRUE(P);
  EXPECT_EQ(*P, (Elements{0, 1, 2, 3, 4, 5}));
  EXPECT_FALSE(gatherShards({S0, S1}, 3, {3, 3}));  // a part not divisible by the ranks
  EXPECT_FALSE(gatherShards({R0, S1}, 2));          // shards of different sizes
  EXPECT_FALSE(gatherShards({R0, R1}, 3));          // not whole rows
}

TEST(Transforms, UnpadKeepsTheRealTokensSequenceAfterSequence) {
  // Two sequences of lengths 3 and 1, padded to 3 on the right (and a
  // left-padded third of length 2), two features each.
  Dims S = {3, 3, 2};
  Elements V = iota(S);
  Elements Mask = {1, 1, 1, 1, 0, 0, 0, 1, 1};
  auto U = unpad(V, S, Mask, {3, 3});
  ASSERT_TRUE(U);
  EXPECT_EQ(*U, (Elements{0, 1, 2, 3, 4, 5, 6, 7, 14, 15, 16, 17}));
  // A batch of one with no padding is the tensor itself.
  auto One = unpad(iota({1, 4, 2}), {1, 4, 2}, Elements(4, 1), {1, 4});
  ASSERT_TRUE(One);
  EXPECT_EQ(*One, iota({1, 4, 2}));
  EXPECT_FALSE(unpad(V, S, Mask, {3, 2}));
  EXPECT_FALSE(unpad(V, {9, 2}, Mask, {3, 3}));
}

TEST(Transforms, UnpageReadsTheTokensSlotsInOrder) {
  // A cache of 3 blocks of 2 slots, one feature each: slot i holds 10 * i.
  Dims S = {3, 2, 1};
  Elements Cache = {0, 10, 20, 30, 40, 50};
  // A sequence whose block table is [2, 0]: positions 0..2 at slots 4, 5, 0.
  auto U = unpage(Cache, S, {4, 5, 0});
  ASSERT_TRUE(U);
  EXPECT_EQ(*U, (Elements{40, 50, 0}));
  EXPECT_FALSE(unpage(Cache, S, {6}));
  // A padding token's slot -1 has nothing cached.
  EXPECT_EQ(*unpage(Cache, S, {1, -1, 2}), (Elements{10, 20}));
  EXPECT_FALSE(unpage(Elements{1}, S, {0}));
  // The same from the bytes: two-byte elements, two features a slot.
  Dims S2 = {3, 2, 2};
  std::string Bytes;
  for (int I = 0; I < 12; ++I)
    Bytes.append({char(I), char(100 + I)});
  auto B = unpageBytes(Bytes, S2, 2, {4, -1, 1});
  ASSERT_TRUE(B);
  EXPECT_EQ(*B, Bytes.substr(4 * 4, 4) + Bytes.substr(1 * 4, 4));
  EXPECT_FALSE(unpageBytes(Bytes, S2, 2, {6}));
  EXPECT_FALSE(unpageBytes(Bytes.substr(1), S2, 2, {0}));
}

TEST(Mapping, PathsMatchWithStarsForOneSegment) {
  auto Stars = matchPath("model.layers.*.self_attn.qkv_proj", "model.layers.12.self_attn.qkv_proj");
  ASSERT_TRUE(Stars);
  EXPECT_EQ(*Stars, (std::vector<std::string>{"12"}));
  EXPECT_FALSE(matchPath("model.layers.*.mlp", "model.layers.1.2.mlp"));
  EXPECT_EQ(substitute("model.layers.*.self_attn.q_proj", *Stars), "model.layers.12.self_attn.q_proj");
  // `**.` takes any leading segments, none included; it takes no star.
  auto Tail = matchPath("**.qkv_proj", "model.layers.2.self_attn.qkv_proj");
  ASSERT_TRUE(Tail);
  EXPECT_TRUE(Tail->empty());
  EXPECT_TRUE(matchPath("**.qkv_proj", "qkv_proj"));
  EXPECT_FALSE(matchPath("**.qkv_proj", "model.qkv_proj.bias"));
  EXPECT_FALSE(matchPath("**.attn", ""));
  EXPECT_TRUE(matchPath("**", ""));
  EXPECT_EQ(*matchPath("**.layers.*.mlp", "model.layers.4.mlp"), (std::vector<std::string>{"4"}));
  auto [Pattern, Numbers] = starred("model.layers.3.mlp.experts.7");
  EXPECT_EQ(Pattern, "model.layers.*.mlp.experts.*");
  EXPECT_EQ(Numbers, (std::vector<std::string>{"3", "7"}));
}

TEST(Mapping, AReferenceMayNameItsInput) {
  EXPECT_EQ(referenceRole("model.layers.0.self_attn.o_proj:input"),
            std::make_pair(std::string("model.layers.0.self_attn.o_proj"), std::string("input")));
  EXPECT_EQ(referenceRole("lm_head"), std::make_pair(std::string("lm_head"), std::string("output")));
  // Anything else after a colon is part of the path.
  EXPECT_EQ(referenceRole("a:b").first, "a:b");
  // The built-in recipes parse, the attention backend's among them.
  EXPECT_TRUE(llvm::any_of(builtinRecipes(), [](const MappingRule &R) {
    return classMatches(R.Classes, "Attention", "vllm.model_executor.layers.attention.Attention") &&
           R.Reference == std::vector<std::string>{"{next}:input"};
  }));
}

TEST(Mapping, ARuleMayNameTheTargetsClass) {
  auto Rules = parseMappingRules(R"({"components": [
      {"class": "SiluAndMul", "reference": "{next}:input"},
      {"class": ["*AndMul", "vllm.*.Attention"], "target": "**.mlp.*",
       "reference": "{parent}.down_proj"}]})",
                                 "test");
  ASSERT_TRUE(bool(Rules)) << toString(Rules.takeError());
  ASSERT_EQ(Rules->size(), 2u);
  EXPECT_EQ((*Rules)[0].Target, "**");
  EXPECT_EQ((*Rules)[1].Target, "**.mlp.*");
  // A glob on the class name; with a dot, on the qualified name.
  const auto &Classes = (*Rules)[1].Classes;
  EXPECT_TRUE(classMatches(Classes, "GeluAndMul", "vllm.layers.activation.GeluAndMul"));
  EXPECT_TRUE(classMatches(Classes, "Attention", "vllm.layers.attention.Attention"));
  EXPECT_FALSE(classMatches(Classes, "Attention", "zoo_engine.model.Attention"));
  EXPECT_FALSE(classMatches(Classes, "AndMulti", "x.AndMulti"));
  // What is refused, with why.
  for (const char *Bad : {
           R"({"components": [{"class": [], "reference": "x"}]})",
           R"({"components": [{"class": "A", "reference": "{sibling}.x"}]})",
           R"({"components": [{"class": "A", "reference": "{next}.x"}]})",
           R"({"components": [{"class": "A", "reference": "a.{parent}"}]})",
           R"({"components": [{"target": "a.**.b", "reference": "x"}]})",
           R"({"components": [{"target": ["a.q", "a.k"], "reference": "{parent}.qk"}]})",
           R"({"components": [{"class": "[", "reference": "x"}]})",
       }) {
    auto R = parseMappingRules(Bad, "test");
    EXPECT_FALSE(bool(R)) << Bad;
    if (!R)
      consumeError(R.takeError());
  }
}

TEST(Mapping, SeveralTargetsAgainstOneReferenceAreOneRulePerPart) {
  auto Rules = parseMappingRules(R"({"components": [
      {"target": ["l.*.q", "l.*.k", "l.*.v"], "reference": "l.*.qkv", "concat_dim": -1},
      {"target": "l.*.o", "reference": "l.*.o_proj"}]})",
                                 "test");
  ASSERT_TRUE(bool(Rules)) << llvm::toString(Rules.takeError());
  ASSERT_EQ(Rules->size(), 4u);
  for (int K = 0; K < 3; ++K) {
    const MappingRule &R = (*Rules)[size_t(K)];
    EXPECT_EQ(R.Part, K);
    EXPECT_EQ(R.Parts, (std::vector<std::string>{"l.*.q", "l.*.k", "l.*.v"}));
    EXPECT_EQ(R.Target, R.Parts[size_t(K)]);
    EXPECT_EQ(R.Reference, std::vector<std::string>{"l.*.qkv"});
  }
  EXPECT_EQ((*Rules)[3].Part, -1);
  EXPECT_TRUE((*Rules)[3].Parts.empty());
  // Many to many is not a mapping.
  auto Bad = parseMappingRules(R"({"components": [{"target": ["a", "b"], "reference": ["c", "d"]}]})",
                               "test");
  ASSERT_FALSE(bool(Bad));
  EXPECT_NE(llvm::toString(Bad.takeError()).find("several targets need one reference"),
            std::string::npos);
}

TEST(Mapping, ARuleMaySayItsComputationIsNoisierByDesign) {
  auto Rules = parseMappingRules(R"({"components": [
      {"class": "vllm.*.Attention", "reference": "{next}:input", "noise": 2},
      {"target": "l.*.o", "reference": "l.*.o_proj", "noise": null},
      {"target": "l.*.n", "reference": "l.*.norm", "noise": 1}]})",
                                 "test");
  ASSERT_TRUE(bool(Rules)) << llvm::toString(Rules.takeError());
  ASSERT_EQ(Rules->size(), 3u);
  EXPECT_EQ((*Rules)[0].Noise, 2.0);
  EXPECT_FALSE((*Rules)[1].Noise); // null, as --calibrate writes none
  EXPECT_EQ((*Rules)[2].Noise, 1.0);
  for (const char *Bad : {R"({"components": [{"target": "a", "reference": "b", "noise": 0.5}]})",
                          R"({"components": [{"target": "a", "reference": "b", "noise": "2"}]})"}) {
    auto R = parseMappingRules(Bad, "test");
    ASSERT_FALSE(bool(R)) << Bad;
    EXPECT_NE(llvm::toString(R.takeError()).find("\"noise\" must be a number of at least 1"),
              std::string::npos);
  }
  // The built-in recipe for an engine's attention backend says so.
  const MappingRule *Attention = nullptr;
  for (const MappingRule &R : builtinRecipes())
    if (llvm::is_contained(R.Classes, "vllm.*.Attention"))
      Attention = &R;
  ASSERT_TRUE(Attention);
  EXPECT_EQ(Attention->Noise, 2.0);
}

TEST(Mapping, ARuleMaySettleALayout) {
  auto Rules = parseMappingRules(R"({"calibrated": {}, "components": [
      {"target": "l.*.attn", "reference": "l.*.attn", "transpose": [0, 1]},
      {"target": "l.*.mlp", "reference": "l.*.mlp", "transpose": null}]})",
                                 "test");
  ASSERT_TRUE(bool(Rules)) << llvm::toString(Rules.takeError());
  ASSERT_EQ(Rules->size(), 2u);
  EXPECT_EQ((*Rules)[0].Transpose, std::make_pair(0, 1));
  EXPECT_EQ((*Rules)[0].Source, "calibration");
  EXPECT_FALSE((*Rules)[1].Transpose);
  for (const char *Bad : {R"({"components": [{"target": "a", "reference": "b", "transpose": [1, 1]}]})",
                          R"({"components": [{"target": "a", "reference": "b", "transpose": [0]}]})",
                          R"({"components": [{"target": "a", "reference": ["b", "c"],
                                              "transpose": [0, 1]}]})"}) {
    auto R = parseMappingRules(Bad, "test");
    ASSERT_FALSE(bool(R)) << Bad;
    EXPECT_NE(llvm::toString(R.takeError()).find("\"transpose\""), std::string::npos);
  }
}

} // namespace
