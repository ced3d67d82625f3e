//===- TorchOps.cpp - The runtime as PyTorch custom ops -------------------===//
//
// The Python shim reaches the runtime through torch.ops.ekka.*: tensors pass
// to C++ without pybind11 or a Python C extension, through the dispatcher
// PyTorch already has. The observer ignores these ops (their names start
// with "ekka::").
//
//===----------------------------------------------------------------------===//
#include "ekka/Runtime/TraceSession.h"

#include <torch/library.h>

namespace {

std::string startOp(std::string Dir, std::string Options, std::string CommandLine) {
  return ekka::startTrace(Dir, Options, CommandLine);
}

int64_t enterOp(std::string Path, std::string ClassName, std::string ClassQualname,
              std::string SourceFile, int64_t SourceLine, bool IsRoot,
              std::vector<at::Tensor> Inputs) {
  return ekka::enterModule(Path, ClassName, ClassQualname, SourceFile, SourceLine, IsRoot,
                           Inputs);
}

void exitOp(int64_t Id, std::vector<at::Tensor> Outputs, std::vector<at::Tensor> KeywordInputs,
            int64_t FirstKeywordIndex) {
  ekka::exitModule(Id, Outputs, KeywordInputs, FirstKeywordIndex);
}

std::string stopOp() { return ekka::stopTrace(); }

} // namespace

TORCH_LIBRARY(ekka, m) {
  m.def("start(str dir, str options, str command_line) -> str", startOp);
  m.def("enter(str path, str class_name, str class_qualname, str source_file, "
        "int source_line, bool is_root, Tensor[] inputs) -> int",
        enterOp);
  m.def("exit(int id, Tensor[] outputs, Tensor[] keyword_inputs, int first_keyword_index) -> ()",
        exitOp);
  m.def("stop() -> str", stopOp);
}
