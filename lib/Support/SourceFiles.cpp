//===- SourceFiles.cpp ----------------------------------------------------===//
#include "ekka/Support/SourceFiles.h"
#include "ekka/Support/Error.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <algorithm>
#include <cerrno>
#include <chrono>

#include <fcntl.h>
#include <unistd.h>

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

/// Why a path could not be stat'ed, resolved or opened, as a skip reason.
StringRef whyUnreadable(std::error_code EC, bool IsLink) {
  if (EC == std::errc::too_many_symbolic_link_levels)
    return "symlink-loop";
  if (EC == std::errc::filename_too_long)
    return "path-too-long";
  if (EC == std::errc::no_such_file_or_directory)
    return IsLink ? "dangling-symlink" : "vanished";
  return "unreadable";
}

unsigned &counterFor(WalkStats &Stats, StringRef Why) {
  if (Why == "symlink-loop")
    return Stats.SymlinkLoops;
  if (Why == "outside-root")
    return Stats.OutsideRoot;
  return Stats.Unreadable;
}

class TreeWalker {
public:
  TreeWalker(std::vector<SourceFile> &Out, WalkStats &Stats)
      : Out(Out), Stats(Stats) {}

  void skip(StringRef Path, StringRef Why) {
    ++counterFor(Stats, Why);
    Stats.Skipped.push_back({Path.str(), Why.str()});
  }

  void addFile(StringRef Path, const sys::fs::file_status &St) {
    auto Lang = languageForPath(Path);
    if (!Lang) {
      ++Stats.OtherFiles;
      return;
    }
    SmallString<256> Real;
    if (std::error_code EC = sys::fs::real_path(Path, Real)) {
      skip(Path, whyUnreadable(EC, /*IsLink=*/false));
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
    if (std::error_code EC = sys::fs::real_path(Dir, Real)) {
      skip(Dir, whyUnreadable(EC, /*IsLink=*/false));
      return;
    }
    // A link out of the root (`up -> ..`) would index whatever lies outside
    // it, a whole file system at worst.
    if (ViaLink && !isUnder(Real, Boundary)) {
      skip(Dir, "outside-root");
      return;
    }
    // A directory reached a second time through a symlink is a loop (or an
    // alias); either way its files are listed already. Reached again as a
    // root, or as a root's subdirectory, it is simply not walked twice.
    if (!SeenDirs.insert(Real).second) {
      if (ViaLink)
        skip(Dir, "symlink-loop");
      return;
    }
    std::error_code EC;
    for (sys::fs::directory_iterator It(Dir, EC, /*follow_symlinks=*/false), End;
         It != End && !EC; It.increment(EC)) {
      StringRef Path = It->path();
      StringRef Name = sys::path::filename(Path);
      bool IsSource = languageForPath(Path).has_value();
      sys::fs::file_status Link, St;
      bool IsLink = !sys::fs::status(Path, Link, /*follow=*/false) &&
                    sys::fs::is_symlink_file(Link);
      if (std::error_code StatEC = sys::fs::status(Path, St)) {
        // A dangling link, a link loop, an entry gone since it was listed or
        // past PATH_MAX: worth a count only if it names source code or a
        // directory (whose files are lost with it).
        if (IsSource || It->type() == sys::fs::file_type::directory_file)
          skip(Path, whyUnreadable(StatEC, IsLink));
        continue;
      }
      bool IsDir = sys::fs::is_directory(St);
      if (IsDir && isSkippedDirectory(Name))
        continue;
      if ((IsDir || IsSource) && !isUTF8(Name)) {
        skip(Path, "not-utf8-name");
        continue;
      }
      if (IsDir) {
        walkDirectory(Path, IsLink);
      } else if (sys::fs::is_regular_file(St)) {
        SmallString<256> Real;
        if (IsLink && IsSource && !sys::fs::real_path(Path, Real) &&
            !isUnder(Real, Boundary))
          skip(Path, "outside-root");
        else
          addFile(Path, St);
      } else if (IsSource) {
        // A FIFO would block the reader for good, a device never end.
        skip(Path, "special-file");
      }
    }
    if (EC)
      skip(Dir, whyUnreadable(EC, /*IsLink=*/false));
  }

private:
  static bool isUTF8(StringRef Name) {
    return classifyContent(Name) == ContentProblem::None;
  }

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

StringRef readSourceText(StringRef Path, uint64_t MaxSize, std::string &Text) {
  // Opened without blocking: a FIFO put where the walk saw a file would wait
  // for a writer for good. The size is checked again on what was opened,
  // and no more than it is read, however the file grows meanwhile.
  SmallString<256> NulTerminated(Path);
  int FD;
  do
    FD = ::open(NulTerminated.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  while (FD < 0 && errno == EINTR);
  if (FD < 0)
    return whyUnreadable(std::error_code(errno, std::generic_category()),
                         /*IsLink=*/false);
  auto Close = make_scope_exit([&] { ::close(FD); });
  sys::fs::file_status St;
  if (std::error_code EC = sys::fs::status(FD, St))
    return whyUnreadable(EC, /*IsLink=*/false);
  if (!sys::fs::is_regular_file(St))
    return "special-file";
  if (St.getSize() > MaxSize)
    return "too-large";
  Text.resize(St.getSize());
  size_t Done = 0;
  while (Done < Text.size()) {
    auto Read = sys::fs::readNativeFile(
        FD, MutableArrayRef<char>(Text.data() + Done, Text.size() - Done));
    if (!Read) {
      consumeError(Read.takeError());
      return "unreadable";
    }
    if (*Read == 0)
      break; // shrunk since
    Done += *Read;
  }
  Text.resize(Done);
  return StringRef();
}

} // namespace ekka
