//===- SubclassResolverTest.cpp -------------------------------------------===//
#include "ekka/Index/SubclassResolver.h"

#include <gtest/gtest.h>

using namespace ekka;

namespace {

ClassInfo py(int64_t Id, int64_t File, std::string Module, std::string Name,
             std::vector<std::string> Bases = {}) {
  ClassInfo C;
  C.Id = Id;
  C.FileId = File;
  C.Module = Module;
  C.Name = Name;
  C.QualifiedName = Module + "." + Name;
  C.Bases = std::move(Bases);
  return C;
}

std::string StringRefName(const std::string &Qualified) {
  size_t At = Qualified.rfind("::");
  return At == std::string::npos ? Qualified : Qualified.substr(At + 2);
}

std::vector<std::tuple<int64_t, int64_t, std::string>>
links(const std::vector<ClassInfo> &Classes, const ImportTable &Imports) {
  std::vector<std::tuple<int64_t, int64_t, std::string>> Out;
  for (const SubclassLink &L : resolveSubclasses(Classes, Imports))
    Out.push_back({L.SubId, L.BaseId, L.How});
  return Out;
}

TEST(SubclassResolver, SameFileBeatsAnOtherwiseAmbiguousName) {
  std::vector<ClassInfo> C = {py(1, 10, "a", "Base"), py(2, 20, "b", "Base"),
                              py(3, 10, "a", "Sub", {"Base"})};
  auto L = links(C, ImportTable());
  ASSERT_EQ(L.size(), 1u);
  EXPECT_EQ(L[0], std::make_tuple(int64_t(3), int64_t(1), std::string("same-file")));
}

TEST(SubclassResolver, ImportAliasesAndModuleAttributes) {
  std::vector<ClassInfo> C = {py(1, 10, "pkg.base", "Model"), py(2, 11, "pkg.other", "Model"),
                              py(3, 20, "pkg.llama", "Llama", {"M"}),
                              py(4, 20, "pkg.llama", "Llama2", {"base.Model"})};
  ImportTable I;
  I[20]["M"] = "pkg.base.Model";
  I[20]["base"] = "pkg.base";
  auto L = links(C, I);
  ASSERT_EQ(L.size(), 2u);
  EXPECT_EQ(L[0], std::make_tuple(int64_t(3), int64_t(1), std::string("import")));
  EXPECT_EQ(L[1], std::make_tuple(int64_t(4), int64_t(1), std::string("import")));
}

TEST(SubclassResolver, UniqueNameAndNoGuessWhenAmbiguous) {
  std::vector<ClassInfo> C = {py(1, 10, "a", "Unique"), py(2, 11, "a2", "Twice"),
                              py(3, 12, "a3", "Twice"),
                              py(4, 20, "b", "S1", {"x.Unique"}),
                              py(5, 20, "b", "S2", {"Twice", "Generic[T]", "nn.Module"})};
  auto L = links(C, ImportTable());
  ASSERT_EQ(L.size(), 1u);
  EXPECT_EQ(L[0], std::make_tuple(int64_t(4), int64_t(1), std::string("unique-name")));
}

TEST(SubclassResolver, CxxQualifiedNamesAndTemplates) {
  ClassInfo Base;
  Base.Id = 1;
  Base.Name = "KernelBase";
  Base.QualifiedName = "lib::KernelBase";
  Base.IsPython = false;
  ClassInfo Sub = Base;
  Sub.Id = 2;
  Sub.Name = "Typed";
  Sub.QualifiedName = "lib::Typed";
  Sub.Bases = {"lib::KernelBase<float>"};
  auto L = links({Base, Sub}, ImportTable());
  ASSERT_EQ(L.size(), 1u);
  EXPECT_EQ(L[0], std::make_tuple(int64_t(2), int64_t(1), std::string("qualified")));
}

TEST(SubclassResolver, CxxQualifiedBaseOnlyLinksToAClassOfThatQualification) {
  auto Cxx = [](int64_t Id, std::string Qualified, std::vector<std::string> Bases = {}) {
    ClassInfo C;
    C.Id = Id;
    C.QualifiedName = Qualified;
    C.Name = StringRefName(Qualified);
    C.IsPython = false;
    C.Bases = std::move(Bases);
    return C;
  };
  std::vector<ClassInfo> C = {
      Cxx(1, "mine::Base"), Cxx(2, "fi::detail::Inner"),
      Cxx(3, "fi::Sub1", {"cutlass::Base"}), Cxx(4, "fi::Sub2", {"std::Base"}),
      Cxx(5, "fi::Sub3", {"detail::Inner"}), Cxx(6, "fi::Sub4", {"::Base"}),
      Cxx(7, "fi::Sub5", {"Base"})};
  auto L = links(C, ImportTable());
  ASSERT_EQ(L.size(), 2u);
  EXPECT_EQ(L[0], std::make_tuple(int64_t(5), int64_t(2), std::string("unique-name")));
  EXPECT_EQ(L[1], std::make_tuple(int64_t(7), int64_t(1), std::string("unique-name")));
}

} // namespace
