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

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

namespace ekka {

/// The deepest nesting of arrays and objects that parseJSON accepts.
constexpr unsigned MaxJSONDepth = 64;

/// llvm::json::parse, refusing text nested deeper than MaxJSONDepth.
llvm::Expected<llvm::json::Value> parseJSON(llvm::StringRef Text);

/// Calls \p Each on every member of the JSON object \p Text in the order
/// written, each member checked and parsed as parseJSON would, alone, and
/// let go before the next: llvm::json gives every object room for 64
/// members (~4 KB), so a safetensors header of 100,000 small entries
/// would take 400 MB parsed whole. Accepts exactly what parseJSON accepts as an object, except a
/// key written twice (refused here, kept once there); stops at the first
/// error, its own or \p Each's.
llvm::Error forEachJSONMember(
    llvm::StringRef Text,
    llvm::function_ref<llvm::Error(llvm::StringRef Key, const llvm::json::Value &Value)> Each);

} // namespace ekka

#endif
