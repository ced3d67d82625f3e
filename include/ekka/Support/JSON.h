//===- JSON.h - JSON from files a user gives -------------------*- C++ -*-===//
//
// llvm::json::parse recurses once per level of nesting: a corrupt trace or
// mapping file with tens of thousands of '[' would overflow the stack.
// Ekka's JSON (shapes, grids, safetensors headers, mapping files) nests a
// few levels; deeper text is refused before it is parsed.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_JSON_H
#define EKKA_SUPPORT_JSON_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

namespace ekka {

/// The deepest nesting of arrays and objects that parseJSON accepts.
constexpr unsigned MaxJSONDepth = 64;

/// llvm::json::parse, refusing text nested deeper than MaxJSONDepth.
llvm::Expected<llvm::json::Value> parseJSON(llvm::StringRef Text);

} // namespace ekka

#endif
