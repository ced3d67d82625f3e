//===- PythonIndexerTest.cpp ----------------------------------------------===//
#include "ekka/Index/PythonIndexer.h"

#include <gtest/gtest.h>

using namespace ekka;
using namespace llvm;

namespace {

/// A file that must parse within its memory limit.
FileDefinitions indexed(StringRef Source, StringRef ModuleName, bool IsPackageInit) {
  Expected<FileDefinitions> F = indexPythonSource(Source, ModuleName, IsPackageInit);
  EXPECT_TRUE(bool(F)) << toString(F.takeError());
  return F ? std::move(*F) : FileDefinitions();
}

const Definition *find(const FileDefinitions &F, StringRef Qualified) {
  for (const Definition &D : F.Definitions)
    if (D.QualifiedName == Qualified)
      return &D;
  return nullptr;
}

TEST(PythonIndexer, QualifiedNamesFollowQualname) {
  FileDefinitions F = indexed(R"(
class Outer:
    class Inner:
        def m(self): pass
def factory():
    class Local:
        pass
    return Local
)", "pkg.mod", false);
  EXPECT_TRUE(find(F, "pkg.mod.Outer"));
  EXPECT_TRUE(find(F, "pkg.mod.Outer.Inner"));
  const Definition *M = find(F, "pkg.mod.Outer.Inner.m");
  ASSERT_TRUE(M);
  EXPECT_EQ(M->Kind, DefinitionKind::Method);
  const Definition *L = find(F, "pkg.mod.factory.<locals>.Local");
  ASSERT_TRUE(L);
  EXPECT_EQ(L->Kind, DefinitionKind::Class);
  EXPECT_EQ(find(F, "pkg.mod.factory")->Kind, DefinitionKind::Function);
}

TEST(PythonIndexer, DecoratedSpanStartsAtFirstDecorator) {
  StringRef Src = "x = 1\n@a\n@b.c(2)\nclass K:\n    pass\n";
  FileDefinitions F = indexed(Src, "m", false);
  const Definition *K = find(F, "m.K");
  ASSERT_TRUE(K);
  EXPECT_EQ(K->LineStart, 2u);
  EXPECT_EQ(K->LineEnd, 5u);
  EXPECT_EQ(Src.slice(K->ByteStart, K->ByteEnd), "@a\n@b.c(2)\nclass K:\n    pass");
  EXPECT_EQ(K->Decorators, (std::vector<std::string>{"a", "b.c(2)"}));
}

TEST(PythonIndexer, BasesExcludeMetaclassAndKeywords) {
  FileDefinitions F = indexed(
      "class K(A, mod.B[int], metaclass=M, total=False):\n    pass\n", "m", false);
  ASSERT_EQ(F.Definitions.size(), 1u);
  EXPECT_EQ(F.Definitions[0].Bases, (std::vector<std::string>{"A", "mod.B[int]"}));
}

TEST(PythonIndexer, AsyncAndMethodsList) {
  FileDefinitions F = indexed(R"(
class S:
    async def run(self): pass
    @staticmethod
    def helper(): pass
    if True:
        def conditional(self): pass
)", "m", false);
  const Definition *S = find(F, "m.S");
  ASSERT_TRUE(S);
  EXPECT_EQ(S->Methods, (std::vector<std::string>{"run", "helper", "conditional"}));
  EXPECT_TRUE(find(F, "m.S.run")->IsAsync);
  EXPECT_FALSE(find(F, "m.S.helper")->IsAsync);
}

TEST(PythonIndexer, SyntaxErrorCostsOnlyTheBrokenPart) {
  FileDefinitions F = indexed(R"(
class Before:
    pass
def broken(:
    return )
class After(Before):
    def ok(self): pass
)", "m", false);
  EXPECT_TRUE(find(F, "m.Before"));
  EXPECT_TRUE(find(F, "m.After"));
  EXPECT_TRUE(find(F, "m.After.ok"));
  EXPECT_GT(F.ParseErrors, 0u);
}

TEST(PythonIndexer, ImportsResolveRelativeToThePackage) {
  FileDefinitions F = indexed(R"(
import torch.nn as nn
import os.path
from . import sibling
from ..top import Thing as T
from .sub.mod import A, B as C
def f():
    import ignored_inside_functions
)", "pkg.inner.mod", false);
  std::vector<std::pair<std::string, std::string>> Got;
  for (const ImportBinding &B : F.Imports)
    Got.push_back({B.Alias, B.Target});
  std::vector<std::pair<std::string, std::string>> Want = {
      {"nn", "torch.nn"},
      {"os", "os"},
      {"sibling", "pkg.inner.sibling"},
      {"T", "pkg.top.Thing"},
      {"A", "pkg.inner.sub.mod.A"},
      {"C", "pkg.inner.sub.mod.B"}};
  EXPECT_EQ(Got, Want);
}

TEST(PythonIndexer, PackageInitResolvesDotToItself) {
  FileDefinitions F = indexed("from .base import Model\n", "pkg.models", true);
  ASSERT_EQ(F.Imports.size(), 1u);
  EXPECT_EQ(F.Imports[0].Target, "pkg.models.base.Model");
}

/// Each `op` registration as `namespace::op <- function [key]`.
std::vector<std::string> ops(const FileDefinitions &F) {
  std::vector<std::string> Out;
  for (const Definition &D : F.Definitions)
    if (D.Kind == DefinitionKind::Op)
      Out.push_back(D.QualifiedName + " <- " + (D.Bases.empty() ? "" : D.Bases[0]) +
                    (D.Decorators.empty() ? "" : " [" + D.Decorators[0] + "]"));
  return Out;
}

TEST(PythonIndexer, OpRegistrationsThroughImportsAndOpObjects) {
  FileDefinitions F = indexed(R"(
from torch.library import custom_op, register_fake
from torch import library as tl
import kernels

@custom_op("mylib::plain", mutates_args=())
def plain(x): return x

def setup():
    my_lib = tl.Library("mine", "IMPL", "CUDA")
    my_lib.impl("gemm.out", kernels.gemm_out)

    @tl.impl(my_lib, "scale", "CPU")
    def scale_cpu(x): return x

register_fake(torch.ops.mylib.plain.default, lambda x: x)
tl.define("mylib::schema_only(Tensor x) -> Tensor", "(Tensor x) -> Tensor")
unrelated.impl("mylib::nothing", fn)
)", "pkg.mod", false);
  EXPECT_EQ(ops(F), (std::vector<std::string>{
                        "mylib::plain <- pkg.mod.plain",
                        "mine::gemm <- kernels.gemm_out [CUDA]",
                        "mine::scale <- pkg.mod.setup.<locals>.scale_cpu [CPU]",
                        "mylib::plain <- (lambda at line 16) [Fake]",
                        "mylib::schema_only <- ",
                    }));
}

// The pass skips what names no registering method and no Library: a
// Library imported under another name still counts, in any nesting.
TEST(PythonIndexer, OpRegistrationsThroughAnAliasedLibrary) {
  FileDefinitions F = indexed(R"(
from torch.library import Library as L
import torch

def make():
    if torch.cuda.is_available():
        lib = L("aliased", "DEF")
        lib.define("scale(Tensor x) -> Tensor")
    return None
)", "pkg.alias", false);
  EXPECT_EQ(ops(F), (std::vector<std::string>{"aliased::scale <- "}));
}

// A dispatch key that is not a literal is kept as written; None is no key.
TEST(PythonIndexer, OpDispatchKeysAsWritten) {
  FileDefinitions F = indexed(R"(
from torch.library import Library
from vllm.utils import direct_register_custom_op

lib = Library("keys", "IMPL", current_platform.dispatch_key)
lib.impl("a", fa)
lib.impl("b", fb, dispatch_key=KEYS[0])
direct_register_custom_op("c", fc, [], None, None, None)
direct_register_custom_op("d", fd, dispatch_key=f"{platform}")
torch.library.register_kernel("keys::e", ("cpu", "cuda"), fe)
torch.library.register_kernel("keys::f", device_types=["cuda"], func=ff)
torch.library.register_kernel("keys::g", ("cpu", DEVICE), fg)
torch.library.register_kernel(
    "keys::h",
    device_types=(
        "cpu",  # the host
        "cuda",
    ),
    func=fh,
)
)", "pkg.keys", false);
  EXPECT_EQ(ops(F), (std::vector<std::string>{
                        "keys::a <- fa [current_platform.dispatch_key]",
                        "keys::b <- fb [KEYS[0]]",
                        "vllm::c <- fc",
                        "vllm::d <- fd",
                        "keys::e <- fe [cpu,cuda]",
                        "keys::f <- ff [cuda]",
                        "keys::g <- fg [(\"cpu\", DEVICE)]",
                        "keys::h <- fh [cpu,cuda]",
                    }));
}

TEST(PythonIndexer, RefusesAParseThatWouldHoldFarMoreThanTheFile) {
  // Each broken line, 55 tabs deep after a broken `def`, costs tree-sitter's
  // error recovery about 1.6 MB: 200 of them (22 KB) would hold 320 MB.
  std::string Costly;
  for (int I = 0; I < 200; ++I)
    Costly += "$ef f(a, b):\n  " + std::string(55, '\t') + "  torch.ops._C.rms_norm(out, s x,\n";
  Expected<FileDefinitions> F = indexPythonSource(Costly, "m", false);
  ASSERT_FALSE(bool(F));
  EXPECT_EQ(toString(F.takeError()),
            "recovering from its syntax errors would take more than 42 MiB of "
            "memory");

  // The same thread's parser, let go of what the cancelled parse held,
  // parses the next file whole; and a large file of ordinary code (4 MB,
  // the default --max-file-size) is well within its limit.
  std::string Large;
  for (int I = 0; Large.size() < (4u << 20); ++I)
    Large += "class C" + std::to_string(I) + "(Base):\n    def forward(self, x):\n"
             "        return self.proj(x) * 2 + torch.ops._C.rms_norm(x, self.w, 1e-6)\n";
  FileDefinitions L = indexed(Large, "m", false);
  EXPECT_EQ(L.ParseErrors, 0u);
  ASSERT_NE(find(L, "m.C0.forward"), nullptr);
  EXPECT_GT(L.Definitions.size(), 50000u);
}

} // namespace
