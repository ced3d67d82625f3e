//===- Sources.cpp - Components, ops and kernels in the code indexes ------===//
#include "ekka/Index/CodeIndex.h"
#include "ekka/Report/Report.h"

#include "llvm/Demangle/Demangle.h"
#include "llvm/Support/FormatVariadic.h"

#include <set>

using namespace llvm;

namespace ekka {

SourceLocator::Link SourceLocator::classSource(const ComponentRatio &C) const {
  for (CodeIndex *I : Indexes) {
    auto Defs = I->classDefinitions(C.ClassQualname);
    if (!Defs) {
      consumeError(Defs.takeError());
      continue;
    }
    if (!Defs->empty()) {
      const IndexedDefinition &D = Defs->front();
      return {D.File + ":" + std::to_string(D.Def.LineStart), D.Source};
    }
  }
  if (C.SourceFile.empty())
    return {};
  return {C.SourceFile + ":" + std::to_string(C.SourceLine), ""};
}

SourceLocator::KernelSite SourceLocator::kernel(StringRef Name) const {
  for (CodeIndex *I : Indexes) {
    auto Defs = I->findKernel(Name);
    if (!Defs) {
      consumeError(Defs.takeError());
      continue;
    }
    if (!Defs->empty())
      return {Defs->front().File + ":" + std::to_string(Defs->front().Def.LineStart),
              Defs->front().Def.QualifiedName};
  }
  return {"", llvm::demangle(Name.str())};
}

std::string SourceLocator::op(StringRef Name) const {
  for (CodeIndex *I : Indexes) {
    auto Defs = I->findOp(Name);
    if (!Defs) {
      consumeError(Defs.takeError());
      continue;
    }
    // A fake implementation (`register_fake`, vLLM's fake_impl) only makes
    // output shapes for tracing: the source to name is the real one.
    std::set<std::string> Fake, Real;
    for (const IndexedDefinition &D : *Defs)
      if (D.Def.Kind == DefinitionKind::Op)
        for (const std::string &F : D.Def.Bases)
          (D.Def.Decorators == std::vector<std::string>{"Fake"} ? Fake : Real).insert(F);
    auto Rank = [&](const IndexedDefinition &D) {
      if (D.Relation.empty())
        return 0;
      auto Named = [&](const std::set<std::string> &S) {
        return S.count(D.Def.QualifiedName) || S.count(D.Def.Name);
      };
      return Named(Fake) && !Named(Real) ? 1 : 2;
    };
    const IndexedDefinition *Best = nullptr;
    for (const IndexedDefinition &D : *Defs)
      if (!Best || Rank(D) > Rank(*Best))
        Best = &D;
    if (Best)
      return Best->File + ":" + std::to_string(Best->Def.LineStart) +
             (Best->Relation.empty() ? " (registration)" : " (" + Best->Def.Name + ")");
  }
  return "";
}

std::string componentName(const ComponentRatio &C) {
  return C.Path.empty() ? "(root " + C.ClassName + ")" : C.Path;
}

std::string ratioText(const std::optional<double> &R) {
  return R ? formatv("{0}", format("%.3g", *R)).str() : std::string("-");
}

} // namespace ekka
