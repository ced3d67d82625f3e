//===- ModelTree.cpp ------------------------------------------------------===//
#include "ekka/Model/ModelTree.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/StringSet.h"

using namespace llvm;

namespace ekka {

namespace {

/// What makes two siblings the same: class and the children's structure,
/// not their names' indices.
std::string signature(const ModelTreeNode &N) {
  std::string S = N.ClassQualname + "(";
  for (const ModelTreeNode &C : N.Children)
    S += StringRef(C.Name).rsplit('.').first.str() + "=" + signature(C) + "x" +
         std::to_string(C.Count) + ",";
  return S + ")";
}

/// `layers.7` -> (`layers`, 7); names that do not end in an index -> none.
std::optional<std::pair<std::string, long>> indexed(StringRef Name) {
  auto [Prefix, Last] = Name.rsplit('.');
  long Index = 0;
  if (Last.empty() || Last.getAsInteger(10, Index))
    return std::nullopt;
  return std::make_pair(Prefix.str(), Index);
}

void fold(std::vector<ModelTreeNode> &Nodes) {
  for (ModelTreeNode &N : Nodes)
    fold(N.Children);
  std::vector<ModelTreeNode> Out;
  for (size_t I = 0; I < Nodes.size();) {
    auto First = indexed(Nodes[I].Name);
    size_t J = I + 1;
    if (First) {
      std::string Sig = signature(Nodes[I]);
      while (J < Nodes.size()) {
        auto Next = indexed(Nodes[J].Name);
        if (!Next || Next->first != First->first ||
            Next->second != First->second + long(J - I) || signature(Nodes[J]) != Sig)
          break;
        ++J;
      }
    }
    ModelTreeNode N = std::move(Nodes[I]);
    if (J - I > 1) {
      N.Count = unsigned(J - I);
      N.Name = First->first + ".{" + std::to_string(First->second) + ".." +
               std::to_string(First->second + long(J - I) - 1) + "}";
    }
    Out.push_back(std::move(N));
    I = J;
  }
  Nodes = std::move(Out);
}

} // namespace

std::vector<ModelTreeNode> buildModelTree(const std::vector<ModuleCallRecord> &Calls,
                                          int64_t Step) {
  // Nodes are built in execution order; a module called again in the step
  // (a shared module) keeps its first call.
  std::vector<ModelTreeNode> Roots;
  DenseMap<int64_t, std::vector<size_t>> Where; // call id -> path in the tree
  StringSet<> Seen;
  for (const ModuleCallRecord &C : Calls) {
    if (C.Step != Step)
      continue;
    std::vector<ModelTreeNode> *Siblings = &Roots;
    std::vector<size_t> Route;
    std::string ParentPath;
    if (C.ParentId) {
      auto It = Where.find(*C.ParentId);
      if (It == Where.end())
        continue;
      Route = It->second;
      ModelTreeNode *P = &Roots[Route[0]];
      for (size_t K = 1; K < Route.size(); ++K)
        P = &P->Children[Route[K]];
      Siblings = &P->Children;
      ParentPath = P->Path;
    }
    std::string Key = std::to_string(C.ParentId.value_or(0)) + "|" + C.Path;
    if (!Seen.insert(Key).second && C.ParentId)
      continue;
    ModelTreeNode N;
    StringRef Rel(C.Path);
    if (!ParentPath.empty() && Rel.starts_with(ParentPath + "."))
      Rel = Rel.drop_front(ParentPath.size() + 1);
    N.Name = Rel.empty() ? "(root)" : Rel.str();
    N.Path = C.Path;
    N.ClassName = C.ClassName;
    N.ClassQualname = C.ClassQualname;
    N.SourceFile = C.SourceFile;
    N.SourceLine = C.SourceLine;
    Route.push_back(Siblings->size());
    Siblings->push_back(std::move(N));
    Where[C.Id] = std::move(Route);
  }
  fold(Roots);
  return Roots;
}

} // namespace ekka
