//===- Definition.cpp -----------------------------------------------------===//
#include "ekka/Index/Definition.h"

namespace ekka {

llvm::StringRef kindName(DefinitionKind K) {
  switch (K) {
  case DefinitionKind::Namespace:
    return "namespace";
  case DefinitionKind::Class:
    return "class";
  case DefinitionKind::Struct:
    return "struct";
  case DefinitionKind::Union:
    return "union";
  case DefinitionKind::Function:
    return "function";
  case DefinitionKind::Method:
    return "method";
  case DefinitionKind::Kernel:
    return "kernel";
  case DefinitionKind::Op:
    return "op";
  }
  return "unknown";
}

bool isRecordKind(DefinitionKind K) {
  return K == DefinitionKind::Class || K == DefinitionKind::Struct ||
         K == DefinitionKind::Union;
}

} // namespace ekka
