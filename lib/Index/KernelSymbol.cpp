//===- KernelSymbol.cpp ---------------------------------------------------===//
#include "ekka/Index/KernelSymbol.h"

#include "llvm/Demangle/Demangle.h"

using namespace llvm;

namespace ekka {

bool isMangledName(StringRef Symbol) { return Symbol.starts_with("_Z"); }

namespace {

/// Drops template argument lists at nesting depth 0 (`a::b<c<d>>::e<f>` ->
/// `a::b::e`), leaving `operator<` and friends alone.
std::string stripTemplateArguments(StringRef Name) {
  std::string Out;
  int Depth = 0;
  for (size_t I = 0; I < Name.size(); ++I) {
    char C = Name[I];
    if (C == '<' && !StringRef(Out).ends_with("operator")) {
      ++Depth;
      continue;
    }
    if (C == '>' && Depth > 0) {
      --Depth;
      continue;
    }
    if (Depth == 0)
      Out += C;
  }
  return Out;
}

/// `void ns::k<1>(float*)` -> `ns::k`.
std::string nameFromSignature(StringRef Sig) {
  Sig = Sig.trim();
  // The parameter list starts at the first '(' outside template arguments
  // that is not part of "(anonymous namespace)".
  int Depth = 0;
  size_t Paren = StringRef::npos;
  for (size_t I = 0; I < Sig.size(); ++I) {
    char C = Sig[I];
    if (C == '<')
      ++Depth;
    else if (C == '>' && Depth > 0)
      --Depth;
    else if (C == '(' && Depth == 0) {
      if (Sig.substr(I).starts_with("(anonymous namespace)")) {
        I += strlen("(anonymous namespace)") - 1;
        continue;
      }
      Paren = I;
      break;
    }
  }
  std::string Name = stripTemplateArguments(Sig.substr(0, Paren));
  StringRef N(Name);
  N = N.trim();
  // The return type, if any, is separated from the name by a space at depth 0.
  size_t Space = N.rfind(' ');
  while (Space != StringRef::npos && N.substr(0, Space).ends_with("(anonymous"))
    Space = N.substr(0, Space).rfind(' ');
  if (Space != StringRef::npos)
    N = N.substr(Space + 1);
  return N.str();
}

} // namespace

std::string kernelQualifiedName(StringRef Symbol) {
  Symbol = Symbol.trim();
  if (isMangledName(Symbol)) {
    ItaniumPartialDemangler D;
    std::string Owned = Symbol.str();
    if (!D.partialDemangle(Owned.c_str()) && D.isFunction()) {
      size_t N = 0;
      char *Ctx = D.getFunctionDeclContextName(nullptr, &N);
      char *Base = D.getFunctionBaseName(nullptr, &N);
      std::string Result;
      if (Ctx && *Ctx)
        Result = std::string(Ctx) + "::";
      if (Base)
        Result += Base;
      std::free(Ctx);
      std::free(Base);
      if (!Result.empty())
        return stripTemplateArguments(Result);
    }
    std::string Demangled = demangle(Owned);
    if (Demangled != Owned)
      return nameFromSignature(Demangled);
    return Owned;
  }
  return nameFromSignature(Symbol);
}

} // namespace ekka
