//===- ModelTree.h - A trace's module tree, repeats folded -----*- C++ -*-===//
//
// The paper's Model Tree: the module calls of one forward as a tree, with
// runs of identical siblings (`layers.0` ... `layers.31`) folded into one
// node ×32, so that two implementations' structures can be read — and later
// mapped — at a glance.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_MODEL_MODELTREE_H
#define EKKA_MODEL_MODELTREE_H

#include "ekka/Trace/TraceFormat.h"

#include <string>
#include <vector>

namespace ekka {

struct ModelTreeNode {
  std::string Name; ///< Relative to the parent: `mlp`, `layers.{0..31}`.
  std::string Path; ///< Of the first member: `model.layers.0`.
  std::string ClassName, ClassQualname, SourceFile;
  int64_t SourceLine = 0;
  unsigned Count = 1; ///< Folded repeats.
  std::vector<ModelTreeNode> Children;
};

/// The tree of the calls of \p Step (the first forward by default), one node
/// per module (a module called twice in the step counts once). Several roots
/// are possible (a program that calls two top-level modules).
std::vector<ModelTreeNode> buildModelTree(const std::vector<ModuleCallRecord> &Calls,
                                          int64_t Step = 1);

} // namespace ekka

#endif
