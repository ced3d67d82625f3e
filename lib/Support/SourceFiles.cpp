//===- SourceFiles.cpp ----------------------------------------------------===//
#include "ekka/Support/SourceFiles.h"
#include "ekka/Support/Error.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <algorithm>
#include <chrono>

using namespace llvm;

namespace ekka {

StringRef languageName(SourceLanguage L) {
  switch (L) {
  case SourceLanguage::Python:
    return "python";
  case SourceLanguage::C:
    return "c";
  case SourceLanguage::Cxx:
    return "c++";
  case SourceLanguage::Cuda:
    return "cuda";
  }
  return "unknown";
}

std::optional<SourceLanguage> languageForPath(StringRef Path) {
  StringRef Ext = sys::path::extension(Path);
  return StringSwitch<std::optional<SourceLanguage>>(Ext)
      .Case(".py", SourceLanguage::Python)
      .Case(".c", SourceLanguage::C)
      .Cases(".cc", ".cpp", ".cxx", ".c++", SourceLanguage::Cxx)
      .Cases(".h", ".hh", ".hpp", ".hxx", ".h++", ".inl", SourceLanguage::Cxx)
      .Cases(".cu", ".cuh", SourceLanguage::Cuda)
      .Default(std::nullopt);
}

bool isHeaderPath(StringRef Path) {
  StringRef Ext = sys::path::extension(Path);
  return Ext == ".h" || Ext == ".hh" || Ext == ".hpp" || Ext == ".hxx" ||
         Ext == ".h++" || Ext == ".inl" || Ext == ".cuh";
}

namespace {

int64_t toNanoseconds(sys::TimePoint<> T) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             T.time_since_epoch())
      .count();
}

bool isSkippedDirectory(StringRef Name) {
  return Name.starts_with(".") || Name == "__pycache__" ||
         Name == "node_modules";
}

class TreeWalker {
public:
  TreeWalker(std::vector<SourceFile> &Out, WalkStats &Stats)
      : Out(Out), Stats(Stats) {}

  void skip(StringRef Path, StringRef Why, unsigned &Counter) {
    ++Counter;
    Stats.Skipped.push_back({Path.str(), Why.str()});
  }

  void addFile(StringRef Path, const sys::fs::file_status &St) {
    auto Lang = languageForPath(Path);
    if (!Lang) {
      ++Stats.OtherFiles;
      return;
    }
    SmallString<256> Real;
    if (sys::fs::real_path(Path, Real)) {
      skip(Path, "unreadable", Stats.Unreadable);
      return;
    }
    // Named by its real path: the same tree indexed through a symlinked path
    // is the same files, not a second copy of each.
    SourceFile F;
    F.Path = Real.str().str();
    F.RealPath = F.Path;
    F.Size = St.getSize();
    F.MTimeNs = toNanoseconds(St.getLastModificationTime());
    F.Language = *Lang;
    Out.push_back(std::move(F));
  }

  /// Walks one root (a real path), never leaving it through a symlink.
  void walkRoot(StringRef Root) {
    Boundary = Root;
    walkDirectory(Root, /*ViaLink=*/false);
  }

  void walkDirectory(StringRef Dir, bool ViaLink) {
    SmallString<256> Real;
    if (sys::fs::real_path(Dir, Real)) {
      skip(Dir, "unreadable", Stats.Unreadable);
      return;
    }
    // A link out of the root (`up -> ..`) would index whatever lies outside
    // it, a whole file system at worst.
    if (ViaLink && !isUnder(Real, Boundary)) {
      skip(Dir, "outside-root", Stats.OutsideRoot);
      return;
    }
    // A directory reached a second time through a symlink is a loop (or an
    // alias); either way its files are listed already. Reached again as a
    // root, or as a root's subdirectory, it is simply not walked twice.
    if (!SeenDirs.insert(Real).second) {
      if (ViaLink)
        skip(Dir, "symlink-loop", Stats.SymlinkLoops);
      return;
    }
    std::error_code EC;
    for (sys::fs::directory_iterator It(Dir, EC, /*follow_symlinks=*/false), End;
         It != End && !EC; It.increment(EC)) {
      StringRef Path = It->path();
      StringRef Name = sys::path::filename(Path);
      sys::fs::file_status Link, St;
      bool IsLink = !sys::fs::status(Path, Link, /*follow=*/false) &&
                    sys::fs::is_symlink_file(Link);
      if (sys::fs::status(Path, St)) {
        // A dangling link or an entry we may not stat: worth a count only
        // if it names source code.
        if (languageForPath(Path))
          skip(Path, "unreadable", Stats.Unreadable);
        continue;
      }
      if (sys::fs::is_directory(St)) {
        if (!isSkippedDirectory(Name))
          walkDirectory(Path, IsLink);
      } else if (sys::fs::is_regular_file(St)) {
        SmallString<256> Real;
        if (IsLink && languageForPath(Path) && !sys::fs::real_path(Path, Real) &&
            !isUnder(Real, Boundary))
          skip(Path, "outside-root", Stats.OutsideRoot);
        else
          addFile(Path, St);
      }
    }
    if (EC)
      skip(Dir, "unreadable", Stats.Unreadable);
  }

private:
  static bool isUnder(StringRef Path, StringRef Root) {
    return Path == Root ||
           (Path.starts_with(Root) &&
            (Root.ends_with("/") || Path.substr(Root.size()).starts_with("/")));
  }

  std::vector<SourceFile> &Out;
  WalkStats &Stats;
  StringSet<> SeenDirs;
  std::string Boundary; ///< Real path of the root being walked.
};

} // namespace

Expected<std::vector<SourceFile>>
collectSourceFiles(ArrayRef<std::string> Roots, WalkStats &Stats) {
  std::vector<SourceFile> Files;
  TreeWalker Walker(Files, Stats);
  for (const std::string &Root : Roots) {
    SmallString<256> Abs(Root);
    if (std::error_code EC = sys::fs::make_absolute(Abs))
      return makeError("cannot resolve '" + Root + "': " + EC.message());
    sys::path::remove_dots(Abs, /*remove_dot_dot=*/true);
    sys::fs::file_status St;
    if (std::error_code EC = sys::fs::status(Abs, St))
      return makeError("cannot read '" + Root + "': " + EC.message());
    SmallString<256> Real;
    if (std::error_code EC = sys::fs::real_path(Abs, Real))
      return makeError("cannot resolve '" + Root + "': " + EC.message());
    if (sys::fs::is_directory(St))
      Walker.walkRoot(Real);
    else if (sys::fs::is_regular_file(St))
      Walker.addFile(Abs, St);
    else
      return makeError("'" + Root + "' is neither a file nor a directory");
  }
  // The same file reached through two roots or a file symlink is listed once.
  StringSet<> SeenReal;
  std::vector<SourceFile> Unique;
  for (SourceFile &F : Files)
    if (SeenReal.insert(F.RealPath).second)
      Unique.push_back(std::move(F));
  llvm::sort(Unique, [](const SourceFile &A, const SourceFile &B) {
    return A.Path < B.Path;
  });
  return Unique;
}

ContentProblem classifyContent(StringRef Content) {
  if (Content.find('\0') != StringRef::npos)
    return ContentProblem::Binary;
  const UTF8 *Begin = reinterpret_cast<const UTF8 *>(Content.data());
  const UTF8 *End = Begin + Content.size();
  // Fast path: pure ASCII needs no decoding.
  const UTF8 *P = Begin;
  while (P != End && *P < 0x80)
    ++P;
  if (P == End)
    return ContentProblem::None;
  return isLegalUTF8String(&P, End) ? ContentProblem::None
                                    : ContentProblem::NotUTF8;
}

} // namespace ekka
