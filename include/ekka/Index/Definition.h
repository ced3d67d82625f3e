//===- Definition.h - One indexed class, function or kernel ----*- C++ -*-===//
#ifndef EKKA_INDEX_DEFINITION_H
#define EKKA_INDEX_DEFINITION_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ekka {

/// What a definition is. Kernels are CUDA `__global__` functions, kept apart
/// from functions because find_kernel links CUPTI's kernel names to them.
/// Ops are PyTorch custom ops as registered (TORCH_LIBRARY), by their
/// registered name, linked to the function implementing them.
enum class DefinitionKind { Namespace, Class, Struct, Union, Function, Method, Kernel, Op };

llvm::StringRef kindName(DefinitionKind K);
/// Whether a kind is a class-like record (answers get_class_definition).
bool isRecordKind(DefinitionKind K);

/// A definition found in one file. Lines are 1-based and inclusive; bytes
/// are offsets into the file's text, so the exact source can be cut out.
struct Definition {
  std::string Name;          ///< `Inner`, `forward`, `BatchPrefillKernel`
  std::string QualifiedName; ///< `pkg.mod.Outer.Inner`, `flashinfer::Foo`
  DefinitionKind Kind = DefinitionKind::Function;
  unsigned LineStart = 0, LineEnd = 0;
  uint64_t ByteStart = 0, ByteEnd = 0;
  /// Base classes as written (Python) or as resolved by Clang (C++).
  std::vector<std::string> Bases;
  /// Names of the methods a class defines itself.
  std::vector<std::string> Methods;
  std::vector<std::string> Decorators; ///< Python decorators, as written.
  bool IsAsync = false;                ///< Python `async def`.
  bool IsTemplate = false;             ///< C++ template (class or function).
  /// Found by the raw lexer in code the parser did not see (an inactive
  /// `#if` branch): the span and name are reliable, bases and types are not.
  bool FoundByLexer = false;
  /// A kernel declared (a prototype) but not defined here; find_kernel
  /// prefers definitions.
  bool IsDeclaration = false;
  std::string USR;                     ///< Clang's unified symbol resolution.
  std::string MangledName;             ///< Itanium name of a non-template kernel.
};

/// A name that a Python module binds by an import: `alias` -> `target`
/// (`nn` -> `torch.nn`, `LlamaMLP` -> `transformers.models.llama.LlamaMLP`).
/// Used to resolve base classes to their definitions.
struct ImportBinding {
  std::string Alias;
  std::string Target;
};

/// Everything one file contributes to the index.
struct FileDefinitions {
  std::vector<Definition> Definitions;
  std::vector<ImportBinding> Imports;
  unsigned ParseErrors = 0; ///< Syntax errors the parser recovered from.
};

} // namespace ekka

#endif
