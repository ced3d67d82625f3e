//===- PythonIndexerInternal.h - Private helpers of PythonIndexer -*- C++ -*-===//
#ifndef EKKA_LIB_INDEX_PYTHONINDEXERINTERNAL_H
#define EKKA_LIB_INDEX_PYTHONINDEXERINTERNAL_H

#include "ekka/Index/Definition.h"

#include "llvm/ADT/StringRef.h"

#include <tree_sitter/api.h>

namespace ekka {

/// Calls F on each child (named or not) of N, in order, in O(children).
template <typename Fn> void forEachChild(TSNode N, Fn F) {
  TSTreeCursor C = ts_tree_cursor_new(N);
  if (ts_tree_cursor_goto_first_child(&C)) {
    do
      F(ts_tree_cursor_current_node(&C));
    while (ts_tree_cursor_goto_next_sibling(&C));
  }
  ts_tree_cursor_delete(&C);
}

/// Finds the PyTorch custom ops that a Python file registers with literal
/// names — vLLM's `direct_register_custom_op`, `@torch.library.custom_op`,
/// `torch.library.Library(...).define/.impl`, `register_fake` — and appends
/// each registration to \p Out as an `op` definition named `namespace::op`,
/// like the C++ registrations: its bases are the implementing function
/// (qualified where this file defines or imports it), its decorators the
/// dispatch key (`Fake` for a fake implementation; as written where it is not
/// a literal: `current_platform.dispatch_key`). \p Out already holds the
/// file's functions and imports. A name built at run time is not read.
void findPythonOpRegistrations(TSNode Root, llvm::StringRef Source, llvm::StringRef ModuleName,
                               FileDefinitions &Out);

} // namespace ekka

#endif
