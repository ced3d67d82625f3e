//===- IndexBuilder.cpp - Build or update a code index --------------------===//
#include "ekka/Index/IndexBuilder.h"
#include "ekka/Index/CodeIndex.h"
#include "ekka/Index/CxxIndexer.h"
#include "ekka/Index/PythonIndexer.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/Printable.h"
#include "ekka/Support/Progress.h"
#include "ekka/Support/SourceFiles.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ThreadPool.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/xxhash.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <set>

using namespace llvm;

namespace ekka {

std::vector<std::string> guessIncludeDirs(StringRef Root) {
  std::vector<std::string> Dirs;
  if (!sys::fs::is_directory(Root))
    return Dirs;
  auto Add = [&](const Twine &P) {
    if (sys::fs::is_directory(P))
      Dirs.push_back(P.str());
  };
  Add(Root);
  Add(Root + "/include");
  Add(Root + "/csrc");
  for (const char *Vendor : {"3rdparty", "third_party", "thirdparty"}) {
    std::error_code EC;
    SmallString<256> VendorDir(Root);
    sys::path::append(VendorDir, Vendor);
    std::vector<std::string> Libraries; // by name: not the file system's order
    for (sys::fs::directory_iterator It(VendorDir, EC), End; It != End && !EC;
         It.increment(EC))
      Libraries.push_back(It->path());
    llvm::sort(Libraries);
    for (const std::string &Library : Libraries)
      Add(Library + "/include");
  }
  return Dirs;
}

namespace {

/// One file's journey through a build.
struct FileWork {
  const SourceFile *File = nullptr;
  std::string Module;     ///< Python module name.
  bool IsPackageInit = false;
  std::string Text;
  std::string Hash;
  std::string Status = "indexed";
  std::string Why; ///< Skipped: what the reason's word stands for, if more.
  /// Touched: same content, new time stamp. Files whose stat is unchanged
  /// never become work.
  enum class Outcome { Touched, Skipped, Parse } Result = Outcome::Parse;
  FileDefinitions Defs;
  bool Claimed = false;   ///< C++: some translation unit recorded it.
  bool UnitRan = false;   ///< C++: parsed as a translation unit of its own.
  bool ForceParse = false; ///< C++: unchanged, but an included file changed.
  std::string RecordedBy; ///< C++: the unit (main file path) that recorded it.
  std::vector<std::string> Includes; ///< C++ main files: what the unit read.
  std::vector<std::string> IncludeMisses; ///< C++ main files: where it looked.
};

std::string hashText(StringRef Text) {
  return utohexstr(xxh3_64bits(arrayRefFromStringRef(Text)), /*LowerCase=*/true);
}

/// Whose record of a file counts, lower first: a source's own unit; a
/// source that includes it; a header unit that includes it; a header's own
/// unit, which sees it out of any includer's context. Among includers of a
/// kind, the first by path. A build keeps the lowest of the units that ran,
/// whichever thread finished first.
std::pair<int, StringRef> recordRank(StringRef Unit, StringRef File) {
  bool Own = Unit == File;
  if (!isHeaderPath(Unit))
    return {Own ? 0 : 1, Own ? StringRef() : Unit};
  return {Own ? 3 : 2, Own ? StringRef() : Unit};
}

/// Whether \p Unit's record of \p File counts before \p Other's (none).
bool recordsBefore(StringRef Unit, StringRef Other, StringRef File) {
  return Other.empty() || recordRank(Unit, File) < recordRank(Other, File);
}

class Builder {
public:
  explicit Builder(const IndexBuildOptions &Options) : Options(Options) {}

  Expected<IndexBuildSummary> run() {
    auto Start = std::chrono::steady_clock::now();
    WalkStats Walk;
    // A large repository's walk and its index's writing take a while: each
    // is a phase on a terminal, between the counts of files parsed.
    std::optional<ProgressBar> Phase(std::in_place, "walking the repository");
    auto Files = collectSourceFiles(Options.Roots, Walk);
    if (!Files)
      return Files.takeError();
    Phase.reset();
    auto Index = CodeIndex::openForWriting(Options.IndexPath);
    if (!Index)
      return Index.takeError();
    auto Stored = (*Index)->fileStates();
    if (!Stored)
      return Stored.takeError();
    // Built by other extraction code: every file is taken as changed.
    auto Revision = (*Index)->meta("parser_revision");
    if (!Revision)
      return Revision.takeError();
    std::string Current = std::to_string(CodeIndex::ParserRevision);
    if (*Revision != Current)
      for (auto &Entry : *Stored) {
        Entry.second.MTimeNs = -1;
        Entry.second.Hash.clear();
      }
    // Where C++ includes are searched, Clang's extra arguments and the
    // unit memory limit: a search directory that appeared (an include/
    // created since), other -I options or another --max-unit-memory can
    // change what any unit holds, so every C++ file is taken as changed.
    // The units' include misses cover the directories that existed.
    auto Search = (*Index)->meta("cxx_search");
    if (!Search)
      return Search.takeError();
    std::string SearchNow = cxxSearch();
    if (*Search != SearchNow)
      for (const SourceFile &F : *Files)
        if (F.Language != SourceLanguage::Python)
          if (auto It = Stored->find(F.Path); It != Stored->end()) {
            It->second.MTimeNs = -1;
            It->second.Hash.clear();
          }

    for (const SourceFile &F : *Files)
      if (wanted(F.Language))
        WalkedByPath[F.Path] = &F;
    Gone = goneFiles(*Stored);
    selectWork(*Files, *Stored);
    ThreadPoolStrategy Strategy = hardware_concurrency(Options.Jobs);
    DefaultThreadPool Pool(Strategy);
    phase("walk");
    readAndParsePython(Pool, *Stored);
    if (Error E = addDependentWork(**Index, *Stored))
      return E;
    phase("read+python");
    if (Error E = parseCxx(Pool, **Index, *Stored, *Files))
      return E;
    phase("c++");
    Phase.emplace("writing the index");
    if (Error E = write(**Index, *Stored))
      return E;
    if (*Revision != Current)
      if (Error E = (*Index)->setMeta("parser_revision", Current))
        return E;
    if (*Search != SearchNow)
      if (Error E = (*Index)->setMeta("cxx_search", SearchNow))
        return E;
    phase("write");
    Phase.reset();

    for (const auto &[Path, Why] : Walk.Skipped) {
      ++Summary.Skipped;
      ++Summary.SkipReasons[Why];
      Summary.SkippedFiles.emplace_back(Path, Why);
      if (Options.Log)
        *Options.Log << "skipped " << printable(Path) << " (" << Why << ")\n";
    }
    auto Counts = (*Index)->counts();
    if (!Counts)
      return Counts.takeError();
    Summary.Definitions = Counts->Definitions;
    if (Error E = (*Index)->finish())
      return E;
    Summary.Files = unsigned(llvm::count_if(
        *Files, [&](const SourceFile &F) { return wanted(F.Language); }));
    llvm::sort(Summary.SkippedFiles);
    Summary.Seconds = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - Start).count();
    return Summary;
  }

private:
  void phase(StringRef Name) {
    auto Now = std::chrono::steady_clock::now();
    if (Options.Log)
      *Options.Log << format("phase %-12s %.3f s\n", Name.str().c_str(),
                             std::chrono::duration<double>(Now - PhaseStart).count());
    PhaseStart = Now;
  }

  bool wanted(SourceLanguage L) const {
    return L == SourceLanguage::Python ? Options.IndexPython : Options.IndexCxx;
  }

  /// Files whose size and time stamp match the index are unchanged without
  /// being read; the rest are read and hashed.
  void selectWork(const std::vector<SourceFile> &Files,
                  const StringMap<IndexedFileState> &Stored) {
    PythonModuleNamer Namer;
    for (const SourceFile &F : Files) {
      if (!wanted(F.Language))
        continue;
      std::string Module;
      if (F.Language == SourceLanguage::Python)
        Module = Namer.moduleName(F.Path);
      auto It = Stored.find(F.Path);
      // Unchanged: same size and time stamp, indexed last time (a skipped
      // file is looked at again: the limits may have changed), and for
      // Python the same module name (an __init__.py may have appeared).
      if (It != Stored.end() && It->second.Size == F.Size &&
          It->second.MTimeNs == F.MTimeNs && It->second.Status == "indexed" &&
          It->second.Module == Module) {
        ++Summary.Unchanged;
        continue;
      }
      FileWork W;
      W.File = &F;
      W.Module = std::move(Module);
      W.IsPackageInit = sys::path::filename(F.Path) == "__init__.py";
      Work.push_back(std::move(W));
      WorkAt[F.Path] = &Work.back();
    }
  }

  void readOne(FileWork &W, const StringMap<IndexedFileState> &Stored) {
    const SourceFile &F = *W.File;
    W.Result = FileWork::Outcome::Parse;
    W.Status = "indexed";
    auto Skip = [&](StringRef Why) {
      W.Status = Why.str();
      W.Result = FileWork::Outcome::Skipped;
    };
    if (F.Size > Options.MaxFileSize)
      return Skip("too-large");
    StringRef Unread = readSourceText(F.Path, Options.MaxFileSize, W.Text);
    if (!Unread.empty())
      return Skip(Unread);
    W.Hash = hashText(W.Text);
    auto It = Stored.find(F.Path);
    if (!W.ForceParse && It != Stored.end() && It->second.Hash == W.Hash &&
        It->second.Status == "indexed" && It->second.Module == W.Module) {
      W.Result = FileWork::Outcome::Touched;
      return;
    }
    switch (classifyContent(W.Text)) {
    case ContentProblem::Binary:
      return Skip("binary");
    case ContentProblem::NotUTF8:
      return Skip("not-utf8");
    case ContentProblem::None:
      break;
    }
    if (F.Language == SourceLanguage::Python) {
      Expected<FileDefinitions> Defs = indexPythonSource(W.Text, W.Module, W.IsPackageInit);
      if (!Defs) {
        W.Why = toString(Defs.takeError());
        return Skip("too-costly");
      }
      W.Defs = std::move(*Defs);
    }
  }

  void readAndParsePython(DefaultThreadPool &Pool,
                          const StringMap<IndexedFileState> &Stored) {
    ProgressBar Bar("reading files", Work.size(), "files");
    // Largest files first, so that no thread is left with a big one at the
    // end while the others idle; workers take the next file from a counter.
    std::vector<FileWork *> Order;
    for (FileWork &W : Work)
      Order.push_back(&W);
    llvm::stable_sort(Order, [](const FileWork *A, const FileWork *B) {
      return A->File->Size > B->File->Size;
    });
    std::atomic<size_t> Next{0};
    for (unsigned T = 0; T < Pool.getMaxConcurrency(); ++T)
      Pool.async([&] {
        for (size_t I = Next++; I < Order.size(); I = Next++) {
          readOne(*Order[I], Stored);
          Bar.advance();
        }
      });
    Pool.wait();
  }

  /// A translation unit's record of a file that this run did not set out to
  /// parse: kept if it is what a fresh build would keep (see parseCxx).
  struct Offer {
    std::string RecordedBy;
    FileDefinitions Defs;
  };

  /// The state of one build's C++ parsing.
  struct CxxRun {
    StringMap<FileWork *> WorkByReal;             ///< C++ work to parse.
    StringMap<const SourceFile *> WalkedByReal;   ///< Every C++ file walked.
    StringMap<Offer> Offers;                      ///< By real path.
    StringSet<> Parsed;                           ///< Main files parsed.
    std::mutex Mutex;
  };

  /// The C++ include search directories: those guessed under each root
  /// that exist now, then the user's -I.
  std::vector<std::string> includeDirs() const {
    std::vector<std::string> Dirs;
    for (const std::string &Root : Options.Roots)
      for (std::string &Dir : guessIncludeDirs(Root))
        Dirs.push_back(std::move(Dir));
    Dirs.insert(Dirs.end(), Options.IncludeDirs.begin(), Options.IncludeDirs.end());
    return Dirs;
  }

  /// What decides what a C++ unit holds, as one text (meta cxx_search):
  /// the search directories, Clang's extra arguments, and the AST memory
  /// past which instantiation stops (a unit cut short under one limit is
  /// recorded in full, or cut elsewhere, under another).
  std::string cxxSearch() const {
    std::string Text;
    for (const std::string &Dir : includeDirs())
      Text += "-I" + Dir + "\n";
    for (const std::string &Arg : Options.ExtraArgs)
      Text += Arg + "\n";
    Text += "max-unit-memory-bytes=" + std::to_string(Options.MaxUnitMemory) + "\n";
    return Text;
  }

  /// Parses the C++ work. Every translation unit records every C++ file it
  /// contains; a file keeps the record of its own unit if it is a source,
  /// else that of the source including it whose path sorts first, else (no
  /// source includes it) that of the header unit including it whose path
  /// sorts first, else its own (recordRank). A header's own unit runs
  /// unless a source includes it. A fresh build parses every source, then
  /// every header no source included, and gets there directly. An
  /// incremental one parses the changed units and those whose records
  /// depend on them (addDependentWork), then settles what they cannot tell
  /// alone: a header they now include first takes their record
  /// (adoptOffers), and a header whose first includer is a unit not parsed
  /// (its recorder was removed or stopped including it) has that unit parsed
  /// too (firstIncludersNotParsed, firstHeaderIncluders). So each header is
  /// recorded as a fresh build would record it.
  Error parseCxx(DefaultThreadPool &Pool, CodeIndex &Index,
                 const StringMap<IndexedFileState> &Stored,
                 const std::vector<SourceFile> &Files) {
    CxxRun Run;
    std::vector<FileWork *> Sources, Headers;
    for (FileWork &W : Work) {
      if (W.File->Language == SourceLanguage::Python ||
          W.Result != FileWork::Outcome::Parse)
        continue;
      Run.WorkByReal[W.File->RealPath] = &W;
      (isHeaderPath(W.File->Path) ? Headers : Sources).push_back(&W);
    }
    if (Run.WorkByReal.empty())
      return Error::success();
    for (const SourceFile &F : Files)
      if (F.Language != SourceLanguage::Python && wanted(F.Language))
        Run.WalkedByReal[F.RealPath] = &F;

    CxxIndexerOptions CxxOptions;
    CxxOptions.IncludeDirs = includeDirs();
    CxxOptions.ExtraArgs = Options.ExtraArgs;
    CxxOptions.MaxSourceSize = Options.MaxFileSize;
    CxxOptions.MaxASTMemory = Options.MaxUnitMemory;
    CxxIndexer Indexer(std::move(CxxOptions));
    SmallString<128> TempDir;
    if (!sys::fs::createUniqueDirectory("ekka-index", TempDir)) {
      SmallString<128> PCH(TempDir);
      sys::path::append(PCH, "prelude.pch");
      bool Precompiled = Indexer.precompilePrelude(PCH);
      if (Options.Log)
        *Options.Log << (Precompiled ? "precompiled the prelude\n"
                                     : "could not precompile the prelude; parsing it in every file\n");
    }
    auto RemoveTemp = make_scope_exit([&] {
      if (!TempDir.empty())
        sys::fs::remove_directories(TempDir);
    });

    ProgressBar Bar("parsing C/C++/CUDA", Sources.size() + Headers.size(), "files");
    auto ParseAll = [&](ArrayRef<FileWork *> Units) {
      for (FileWork *W : Units)
        Pool.async([&, W] {
          parseUnit(Indexer, Run, *W);
          Bar.advance();
        });
      Pool.wait();
    };
    // Sources first: a header is cheapest to index as part of a translation
    // unit that includes it anyway; headers no source includes come after.
    ParseAll(Sources);
    adoptOffers(Run, Stored);
    auto Firsts = firstIncludersNotParsed(Index, Run, Headers);
    if (!Firsts)
      return Firsts.takeError();
    if (!Firsts->empty()) {
      std::vector<FileWork *> Again;
      for (const SourceFile *F : *Firsts)
        if (FileWork *W = addForcedWork(*F, Stored)) {
          Run.WorkByReal[F->RealPath] = W;
          Again.push_back(W);
        }
      Bar.restart("parsing C/C++/CUDA", Again.size() + Headers.size(), "files");
      ParseAll(Again);
      adoptOffers(Run, Stored);
    }
    if (Error E = firstHeaderIncluders(Index, Run, Headers, Stored))
      return E;
    ParseAll(Headers);
    adoptOffers(Run, Stored);
    return Error::success();
  }

  void parseUnit(CxxIndexer &Indexer, CxxRun &Run, FileWork &W) {
    bool IsHeader = isHeaderPath(W.File->Path);
    if (IsHeader) {
      // Recorded by a source that includes it (all sources are parsed by
      // now); what header units did so far does not count, or which ran
      // would depend on thread order.
      std::lock_guard<std::mutex> Lock(Run.Mutex);
      if (W.Claimed && !isHeaderPath(W.RecordedBy))
        return;
    }
    auto TUStart = std::chrono::steady_clock::now();
    CxxTranslationUnit TU = Indexer.indexTranslationUnit(
        W.File->Path, W.File->Language,
        [&](StringRef RealPath) { return Run.WalkedByReal.count(RealPath) != 0; });
    double TUSeconds = std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - TUStart).count();
    std::lock_guard<std::mutex> Lock(Run.Mutex);
    Run.Parsed.insert(W.File->Path);
    W.UnitRan = true;
    W.Includes = std::move(TU.Includes);
    W.IncludeMisses = std::move(TU.IncludeMisses);
    for (CxxFileDefinitions &R : TU.Files) {
      FileWork *Target = Run.WorkByReal.lookup(R.RealPath);
      if (!Target) {
        // A file this run did not set out to parse: adoptOffers decides
        // whether this record replaces what the index holds.
        Offer &O = Run.Offers[R.RealPath];
        if (recordsBefore(W.File->Path, O.RecordedBy, StringRef()))
          O = {W.File->Path, std::move(R.Definitions)};
        continue;
      }
      if (Target->Claimed &&
          !recordsBefore(W.File->Path, Target->RecordedBy, Target->File->Path))
        continue;
      Target->Defs = std::move(R.Definitions);
      Target->RecordedBy = W.File->Path;
      Target->Claimed = true;
    }
    if (Options.Log)
      *Options.Log << "parsed " << printable(W.File->Path) << format(" in %.2f s", TUSeconds)
                   << " (" << TU.Files.size() << " files recorded, " << TU.ParseErrors
                   << " errors"
                   << (TU.StoppedInstantiating
                           ? "; no template instantiated past --max-unit-memory"
                           : "")
                   << ")\n";
  }

  /// A header that a parsed unit includes and whose record counts after
  /// that unit's (recordRank) takes that unit's record: the unit is new, or
  /// includes it now.
  void adoptOffers(CxxRun &Run, const StringMap<IndexedFileState> &Stored) {
    for (auto &Entry : Run.Offers) {
      const SourceFile *F = Run.WalkedByReal.lookup(Entry.getKey());
      if (!F || !isHeaderPath(F->Path))
        continue; // a source is always its own unit's record
      Offer &O = Entry.getValue();
      auto It = Stored.find(F->Path);
      StringRef Old = It == Stored.end() ? StringRef() : StringRef(It->second.RecordedBy);
      if (!recordsBefore(O.RecordedBy, Old, F->Path))
        continue;
      FileWork *W = addForcedWork(*F, Stored);
      if (!W || W->Result != FileWork::Outcome::Parse)
        continue;
      W->Defs = std::move(O.Defs);
      W->RecordedBy = O.RecordedBy;
      W->Claimed = true;
      Run.WorkByReal[F->RealPath] = W;
    }
    Run.Offers.clear();
  }

  /// Sources not parsed in this run that include one of \p Headers and sort
  /// before the unit that recorded it (or it has no record yet): the first
  /// includer's record is the one to keep, so they must be parsed.
  Expected<std::vector<const SourceFile *>>
  firstIncludersNotParsed(CodeIndex &Index, CxxRun &Run, ArrayRef<FileWork *> Headers) {
    std::vector<const SourceFile *> Out;
    if (Headers.empty())
      return Out;
    std::vector<std::string> Reals;
    for (const FileWork *H : Headers)
      Reals.push_back(H->File->RealPath);
    auto Includers = Index.includersOfEach(Reals);
    if (!Includers)
      return Includers.takeError();
    std::set<std::string> Chosen;
    for (const FileWork *H : Headers) {
      const SourceFile *First = nullptr;
      for (const std::string &Main : (*Includers)[H->File->RealPath]) {
        if (isHeaderPath(Main) || Run.Parsed.count(Main))
          continue;
        auto It = WalkedByPath.find(Main);
        const SourceFile *F = It == WalkedByPath.end() ? nullptr : It->second;
        if (!F || (H->Claimed && Main >= H->RecordedBy) || (First && Main >= First->Path))
          continue;
        First = F;
      }
      if (First && Chosen.insert(First->Path).second)
        Out.push_back(First);
    }
    return Out;
  }

  /// Header units that must run for \p Headers to be recorded as a fresh
  /// build would: for each header no source records, the first (by path)
  /// header including it whose own unit runs, among those not parsed in
  /// this run (those that are may no longer include it); then the same for
  /// those. They are added to \p Headers.
  Error firstHeaderIncluders(CodeIndex &Index, CxxRun &Run, std::vector<FileWork *> &Headers,
                             const StringMap<IndexedFileState> &Stored) {
    StringSet<> InRun;
    for (const FileWork *H : Headers)
      InRun.insert(H->File->Path);
    auto UnitRuns = [&](StringRef Header) {
      auto It = Stored.find(Header);
      return It == Stored.end() || It->second.RecordedBy.empty() ||
             isHeaderPath(It->second.RecordedBy);
    };
    for (std::vector<FileWork *> Pending = Headers; !Pending.empty();) {
      std::vector<std::string> Reals;
      for (const FileWork *H : Pending)
        if (!H->Claimed || isHeaderPath(H->RecordedBy))
          Reals.push_back(H->File->RealPath);
      auto Includers = Index.includersOfEach(Reals);
      if (!Includers)
        return Includers.takeError();
      Pending.clear();
      for (const std::string &Real : Reals) {
        const SourceFile *First = nullptr;
        for (const std::string &Main : (*Includers)[Real]) {
          const SourceFile *F = WalkedByPath.lookup(Main);
          if (F && isHeaderPath(Main) && F->RealPath != Real && !InRun.count(Main) &&
              UnitRuns(Main) && (!First || Main < First->Path))
            First = F;
        }
        if (!First)
          continue;
        InRun.insert(First->Path);
        FileWork *W = addForcedWork(*First, Stored);
        if (!W || W->Result != FileWork::Outcome::Parse)
          continue;
        Run.WorkByReal[First->RealPath] = W;
        Headers.push_back(W);
        Pending.push_back(W);
      }
    }
    return Error::success();
  }

  /// \p F as work to parse although unchanged (counted as unchanged by
  /// selectWork); the work already there if \p F is in it (a time stamp
  /// moved).
  FileWork *addForcedWork(const SourceFile &F, const StringMap<IndexedFileState> &Stored) {
    if (FileWork *W = WorkAt.lookup(F.Path)) {
      if (W->Result == FileWork::Outcome::Touched) {
        W->ForceParse = true;
        readOne(*W, Stored);
      }
      return W;
    }
    Work.emplace_back();
    FileWork &W = Work.back();
    WorkAt[F.Path] = &W;
    W.File = &F;
    W.ForceParse = true;
    --Summary.Unchanged;
    readOne(W, Stored);
    return &W;
  }

  /// C++ files whose record depends on a changed, removed or new file: the
  /// translation units of changed files, those that include a changed or
  /// removed file and those whose #include would now find a new file first
  /// are parsed again, and with them every file they recorded. Without this
  /// a changed macro in a header would leave the kernels that use it, and
  /// the headers it reaches, as they were; a changed or removed source would
  /// leave the headers it recorded as it saw them; a new header beside a
  /// source would not replace the one its `#include` found further along
  /// the search path.
  Error addDependentWork(CodeIndex &Index, const StringMap<IndexedFileState> &Stored) {
    std::vector<std::string> Changed, Mains, New;
    for (FileWork &W : Work) {
      if (W.File->Language != SourceLanguage::Python &&
          W.Result == FileWork::Outcome::Parse) {
        Changed.push_back(W.File->RealPath);
        Mains.push_back(W.File->Path);
        if (!Stored.count(W.File->Path))
          New.push_back(W.File->RealPath);
      }
    }
    for (const std::string &Path : Gone)
      if (languageForPath(Path) != SourceLanguage::Python) {
        Changed.push_back(Path);
        Mains.push_back(Path);
      }
    if (Changed.empty())
      return Error::success();
    auto Includers = Index.includersOf(Changed);
    if (!Includers)
      return Includers.takeError();
    auto Missing = Index.unitsMissing(New);
    if (!Missing)
      return Missing.takeError();
    Includers->insert(Includers->end(), Missing->begin(), Missing->end());
    Mains.insert(Mains.end(), Includers->begin(), Includers->end());
    auto Recorded = Index.filesRecordedBy(Mains);
    if (!Recorded)
      return Recorded.takeError();
    for (const std::vector<std::string> *List : {&*Includers, &*Recorded})
      for (const std::string &Path : *List) {
        auto It = WalkedByPath.find(Path);
        if (It != WalkedByPath.end())
          addForcedWork(*It->second, Stored);
      }
    return Error::success();
  }

  /// Files indexed under the roots last time that the walk did not find.
  std::vector<std::string> goneFiles(const StringMap<IndexedFileState> &Stored) {
    // A root's files are named by real paths; an index that named them by
    // the path given (a symlinked one) has those entries dropped too.
    std::vector<std::string> AbsRoots;
    for (const std::string &Root : Options.Roots) {
      SmallString<256> Abs(Root), Real;
      sys::fs::make_absolute(Abs);
      sys::path::remove_dots(Abs, true);
      AbsRoots.push_back(Abs.str().str());
      if (!sys::fs::real_path(Abs, Real) && Real != Abs)
        AbsRoots.push_back(Real.str().str());
    }
    std::vector<std::string> Out;
    for (const auto &Entry : Stored) {
      StringRef Path = Entry.getKey();
      auto Lang = languageForPath(Path);
      if (WalkedByPath.count(Path) || !Lang || !wanted(*Lang))
        continue;
      // Outside the given paths, one indexed by another build is kept, as
      // long as it exists (a checkout removed since is dropped, not named
      // by queries for good).
      if (llvm::any_of(AbsRoots, [&](const std::string &R) { return underRoot(Path, R); }) ||
          !sys::fs::exists(Path))
        Out.push_back(Path.str());
    }
    llvm::sort(Out);
    return Out;
  }

  static bool underRoot(StringRef Path, StringRef Root) {
    if (Path == Root)
      return true;
    return Path.starts_with(Root) &&
           (Root.ends_with("/") || Path.substr(Root.size()).starts_with("/"));
  }

  Error write(CodeIndex &Index, const StringMap<IndexedFileState> &Stored) {
    if (Error E = Index.beginBatch())
      return E;
    bool Changed = false;
    for (FileWork &W : Work) {
      IndexedFile F;
      F.Path = W.File->Path;
      F.Language = W.File->Language;
      F.Module = W.Module;
      F.Size = W.File->Size;
      F.MTimeNs = W.File->MTimeNs;
      F.Hash = W.Hash;
      F.Status = W.Status;
      F.RecordedBy = W.RecordedBy;
      F.Includes = std::move(W.Includes);
      F.IncludeMisses = std::move(W.IncludeMisses);
      // A header unit that did not run this time (another header's record
      // was adopted for it) still runs in a fresh build: what it included
      // last time still holds.
      F.KeepIncludes = !W.UnitRan && F.Language != SourceLanguage::Python &&
                       isHeaderPath(F.Path) && isHeaderPath(W.RecordedBy);
      // The file's rows, as this run found it: an Error assigned over
      // another unchecked one would be a contract violation in LLVM.
      auto Store = [&]() -> Error {
        switch (W.Result) {
        case FileWork::Outcome::Touched:
          ++Summary.Unchanged;
          return Index.updateFileTime(F.Path, F.MTimeNs);
        case FileWork::Outcome::Skipped: {
          ++Summary.Skipped;
          ++Summary.SkipReasons[W.Status];
          Summary.SkippedFiles.emplace_back(F.Path, W.Status);
          if (Options.Log)
            *Options.Log << "skipped " << printable(F.Path) << " (" << W.Status
                         << (W.Why.empty() ? "" : ": ") << printable(W.Why) << ")\n";
          auto It = Stored.find(F.Path);
          if (It != Stored.end() && It->second.Status == W.Status &&
              It->second.Size == F.Size && It->second.MTimeNs == F.MTimeNs)
            return Error::success(); // skipped last time too, for the same reason
          Changed = true;
          return Index.storeSkippedFile(F);
        }
        case FileWork::Outcome::Parse:
          ++Summary.Parsed;
          Changed = true;
          return Index.storeFile(F, W.Text, W.Defs);
        }
        return Error::success();
      };
      if (Error E = Store())
        return E;
    }

    for (const std::string &Path : Gone) {
      if (Error E = Index.removeFile(Path))
        return E;
      ++Summary.Removed;
      Changed = true;
    }
    if (Changed)
      if (Error E = Index.rebuildSubclassLinks())
        return E;
    return Index.commitBatch();
  }

  const IndexBuildOptions &Options;
  std::deque<FileWork> Work; ///< Grows while C++ is parsed: no reallocation.
  StringMap<FileWork *> WorkAt; ///< Work by path.
  StringMap<const SourceFile *> WalkedByPath; ///< Files walked, of wanted languages.
  std::vector<std::string> Gone;              ///< Indexed last time, not walked now.
  IndexBuildSummary Summary;
  std::chrono::steady_clock::time_point PhaseStart = std::chrono::steady_clock::now();
};

} // namespace

Expected<IndexBuildSummary> buildIndex(const IndexBuildOptions &Options) {
  return Builder(Options).run();
}

} // namespace ekka
