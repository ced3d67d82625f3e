//===- SubclassResolver.cpp -----------------------------------------------===//
#include "ekka/Index/SubclassResolver.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/StringSet.h"

using namespace llvm;

namespace ekka {

namespace {

class Resolver {
public:
  Resolver(ArrayRef<ClassInfo> Classes, const ImportTable &Imports,
           const StringMap<int64_t> &ModuleFiles)
      : Classes(Classes), Imports(Imports), ModuleFiles(ModuleFiles) {
    for (size_t I = 0; I < Classes.size(); ++I) {
      const ClassInfo &C = Classes[I];
      ByQualified[key(C.IsPython, C.QualifiedName)].push_back(I);
      ByName[key(C.IsPython, C.Name)].push_back(I);
      if (C.IsPython)
        Packages.insert(StringRef(C.Module).split('.').first);
    }
    for (const auto &M : ModuleFiles)
      Packages.insert(M.getKey().split('.').first);
  }

  void resolve(std::vector<SubclassLink> &Out) {
    for (size_t I = 0; I < Classes.size(); ++I)
      for (const std::string &Base : Classes[I].Bases)
        if (auto Link = resolveBase(Classes[I], Base))
          Out.push_back(*Link);
  }

private:
  static std::string key(bool IsPython, StringRef Name) {
    return (IsPython ? "py:" : "cc:") + Name.str();
  }

  const std::vector<size_t> *lookup(const StringMap<std::vector<size_t>> &Map,
                                    bool IsPython, StringRef Name) const {
    auto It = Map.find(key(IsPython, Name));
    return It == Map.end() ? nullptr : &It->second;
  }

  /// The single candidate other than Sub itself, if there is exactly one.
  std::optional<size_t> single(const std::vector<size_t> *Candidates,
                               const ClassInfo &Sub) const {
    if (!Candidates)
      return std::nullopt;
    std::optional<size_t> Found;
    for (size_t C : *Candidates) {
      if (Classes[C].Id == Sub.Id)
        continue;
      if (Found)
        return std::nullopt;
      Found = C;
    }
    return Found;
  }

  std::optional<SubclassLink> link(const ClassInfo &Sub, StringRef Base,
                                   size_t Target, StringRef How) const {
    return SubclassLink{Classes[Target].Id, Sub.Id, Base.str(), How.str()};
  }

  /// The class a dotted Python name denotes, following re-exports: when
  /// `pkg.Model` is no class, but module `pkg` imports `Model` from
  /// `pkg.modeling`, it is `pkg.modeling.Model`.
  std::optional<size_t> resolvePython(StringRef Full, const ClassInfo &Sub,
                                      unsigned Depth = 0) const {
    if (auto T = single(lookup(ByQualified, true, Full), Sub))
      return T;
    auto [Module, Name] = Full.rsplit('.');
    if (Name.empty() || Depth > 8)
      return std::nullopt;
    auto File = ModuleFiles.find(Module);
    if (File == ModuleFiles.end())
      return std::nullopt;
    auto FileImports = Imports.find(File->second);
    if (FileImports == Imports.end())
      return std::nullopt;
    auto Bound = FileImports->second.find(Name);
    if (Bound == FileImports->second.end() || Bound->second == Full)
      return std::nullopt;
    return resolvePython(Bound->second, Sub, Depth + 1);
  }

  std::optional<SubclassLink> resolveBase(const ClassInfo &Sub,
                                          StringRef Written) const {
    // `Generic[T]`, `Base<T>`: the class is what comes before the arguments.
    StringRef Base = Written.split('[').first.split('<').first.trim();
    if (Base.empty() || Base.contains('('))
      return std::nullopt;
    StringRef Sep = Sub.IsPython ? "." : "::";
    StringRef Last = Base.rsplit(Sep).second.empty() ? Base : Base.rsplit(Sep).second;

    if (Sub.IsPython) {
      if (!Base.contains('.'))
        if (auto T = single(lookup(ByQualified, true, Sub.Module + "." + Base.str()), Sub))
          if (Classes[*T].FileId == Sub.FileId)
            return link(Sub, Written, *T, "same-file");
      auto FileImports = Imports.find(Sub.FileId);
      if (FileImports != Imports.end()) {
        auto [Head, Rest] = Base.split('.');
        auto Bound = FileImports->second.find(Head);
        if (Bound != FileImports->second.end()) {
          std::string Full = Bound->second;
          if (!Rest.empty())
            (Full += '.') += Rest;
          if (auto T = resolvePython(Full, Sub))
            return link(Sub, Written, *T, "import");
          // Bound to a package the index does not hold: whatever class of
          // that name the index has, it is not this one.
          if (!Packages.count(StringRef(Full).split('.').first))
            return std::nullopt;
        }
      }
    } else {
      if (auto T = single(lookup(ByQualified, false, Base), Sub))
        return link(Sub, Written, *T, "qualified");
      // A qualified base says where it lives: only a class whose qualified
      // name ends with what was written can be it (`detail::Inner` in `fi`
      // is `fi::detail::Inner`). `cutlass::Base`, from a library the index
      // does not hold, is not the index's one `mine::Base`.
      StringRef Name = Base;
      bool Global = Name.consume_front("::");
      if (Global || Name.contains("::")) {
        if (Global)
          if (auto T = single(lookup(ByQualified, false, Name), Sub))
            return link(Sub, Written, *T, "qualified");
        std::string Suffix = ("::" + Name.str());
        std::vector<size_t> Candidates;
        if (!Global)
          if (const std::vector<size_t> *Named = lookup(ByName, false, Last))
            for (size_t C : *Named)
              if (StringRef(Classes[C].QualifiedName).ends_with(Suffix))
                Candidates.push_back(C);
        if (auto T = single(&Candidates, Sub))
          return link(Sub, Written, *T, "unique-name");
        return std::nullopt;
      }
    }
    if (auto T = single(lookup(ByName, Sub.IsPython, Last), Sub))
      return link(Sub, Written, *T, "unique-name");
    return std::nullopt;
  }

  ArrayRef<ClassInfo> Classes;
  const ImportTable &Imports;
  const StringMap<int64_t> &ModuleFiles;
  StringMap<std::vector<size_t>> ByQualified, ByName;
  StringSet<> Packages; ///< Top-level Python packages in the index.
};

} // namespace

std::vector<SubclassLink> resolveSubclasses(ArrayRef<ClassInfo> Classes,
                                            const ImportTable &Imports,
                                            const StringMap<int64_t> &ModuleFiles) {
  std::vector<SubclassLink> Links;
  Resolver(Classes, Imports, ModuleFiles).resolve(Links);
  return Links;
}

} // namespace ekka
