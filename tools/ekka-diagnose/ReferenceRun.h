//===- ReferenceRun.h - ekka-diagnose runs the reference itself -*- C++ -*-===//
//
// --reference-model DIR: HuggingFace Transformers' model from DIR, run by
// Ekka on exactly the token ids each request of the target consumed
// (python/ekka/reference.py), traced by ekka-trace in the target's dtype
// and in FP32. The driver's part: files, processes, messages.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_TOOLS_EKKA_DIAGNOSE_REFERENCERUN_H
#define EKKA_TOOLS_EKKA_DIAGNOSE_REFERENCERUN_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>

namespace ekka {

class TraceReader;

struct ReferenceRunOptions {
  std::string ModelDir;
  std::string OutDir;   ///< where the two traces and requests.json go
  std::string Python;   ///< the interpreter with torch and transformers
  std::string Argv0;    ///< to find ekka-trace beside ekka-diagnose
  bool Quiet = false;   ///< no progress lines
};

struct ReferenceTraces {
  std::string LowPrecision, FP32; ///< FP32 empty where the target is FP32
};

/// Runs (or reuses, when OutDir holds the same requests of the same model)
/// the two reference traces for \p Target.
llvm::Expected<ReferenceTraces> runReference(llvm::ArrayRef<TraceReader *> Target,
                                             const ReferenceRunOptions &O);

} // namespace ekka

#endif
