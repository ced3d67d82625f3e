//===- CxxIndexer.cpp - C++/CUDA definitions via Clang libTooling --------===//
#include "ekka/Index/CxxIndexer.h"
#include "CxxIndexerInternal.h"
#include "ekka/Config.h"

#include "clang/AST/ASTConsumer.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/Attr.h"
#include "clang/AST/DeclCXX.h"
#include "clang/AST/DeclTemplate.h"
#include "clang/AST/GlobalDecl.h"
#include "clang/AST/Mangle.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/Basic/Diagnostic.h"
#include "clang/Basic/DiagnosticLex.h"
#include "clang/Basic/FileManager.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Frontend/CompilerInstance.h"
#include "clang/Frontend/CompilerInvocation.h"
#include "clang/Frontend/FrontendAction.h"
#include "clang/Frontend/FrontendActions.h"
#include "clang/Index/USRGeneration.h"
#include "clang/Lex/HeaderSearch.h"
#include "clang/Lex/Lexer.h"
#include "clang/Lex/PPCallbacks.h"
#include "clang/Lex/Preprocessor.h"
#include "clang/Sema/Sema.h"
#include "clang/Sema/TemplateInstCallback.h"
#include "clang/Tooling/Tooling.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/VirtualFileSystem.h"

#include <memory>
#include <thread>

using namespace clang;
using namespace llvm;

namespace ekka {

/// Feature macros that real CUDA code guards kernels with. Defining them
/// shows the parser more kernels; what stays hidden (`__CUDA_ARCH__` branches)
/// the lexical pass finds.
static constexpr const char *FeatureMacros[] = {
    "ENABLE_BF16", "ENABLE_FP8", "ENABLE_FP4", "__CUDACC_VER_MAJOR__=13",
    "__CUDACC_VER_MINOR__=0", "CUDA_VERSION=13000", "CUDART_VERSION=13000"};

namespace {

constexpr const char *PreludePath = "/__ekka__/ekka_cuda_prelude.h";
constexpr const char *PCHSourcePath = "/__ekka__/ekka_precompiled_prelude.cu";

/// What the precompiled prelude holds: the CUDA prelude and the standard
/// headers nearly every C++/CUDA source includes. Parsing these once instead
/// of in every translation unit halves the time of a cold C++ index.
constexpr const char *PCHSource = R"(#include "/__ekka__/ekka_cuda_prelude.h"
#include <cassert>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <thread>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>
)";

/// Counts the errors Clang recovered from; prints nothing.
class CountingDiagConsumer : public DiagnosticConsumer {
public:
  void HandleDiagnostic(DiagnosticsEngine::Level Level,
                        const Diagnostic &Info) override {
    if (Level >= DiagnosticsEngine::Error)
      ++Errors;
  }
  unsigned Errors = 0;
};

/// Where in the output a claimed file's definitions go.
using ClaimedFiles = DenseMap<FileID, unsigned>;

class DefinitionCollector : public RecursiveASTVisitor<DefinitionCollector> {
public:
  DefinitionCollector(ASTContext &Ctx, const ClaimedFiles &Claimed,
                      CxxTranslationUnit &Out)
      : Ctx(Ctx), SM(Ctx.getSourceManager()), Claimed(Claimed), Out(Out),
        Mangler(ItaniumMangleContext::create(Ctx, Ctx.getDiagnostics())) {}

  bool shouldVisitTemplateInstantiations() const { return false; }
  bool shouldVisitImplicitCode() const { return false; }

  bool TraverseDecl(Decl *D) {
    if (!D)
      return true;
    // Only namespaces and linkage specs can hold declarations of another
    // file; anything else outside the claimed files is pruned here.
    if (!isa<TranslationUnitDecl, NamespaceDecl, LinkageSpecDecl>(D) &&
        !fileSlot(D))
      return true;
    return RecursiveASTVisitor::TraverseDecl(D);
  }

  bool VisitNamespaceDecl(NamespaceDecl *ND) {
    if (!ND->isAnonymousNamespace())
      record(ND, ND, DefinitionKind::Namespace);
    return true;
  }

  bool VisitRecordDecl(RecordDecl *RD) {
    if (!RD->isThisDeclarationADefinition() || RD->isImplicit() ||
        !RD->getIdentifier() || RD->isLambda())
      return true;
    if (auto *Spec = dyn_cast<ClassTemplateSpecializationDecl>(RD))
      if (!Spec->isExplicitSpecialization())
        return true;
    DefinitionKind K = RD->isUnion()    ? DefinitionKind::Union
                       : RD->isStruct() ? DefinitionKind::Struct
                                        : DefinitionKind::Class;
    const Decl *Span = RD;
    if (auto *CRD = dyn_cast<CXXRecordDecl>(RD))
      if (ClassTemplateDecl *CTD = CRD->getDescribedClassTemplate())
        Span = CTD;
    Definition *Def = record(RD, Span, K);
    if (!Def)
      return true;
    if (auto *CRD = dyn_cast<CXXRecordDecl>(RD)) {
      Def->IsTemplate = CRD->getDescribedClassTemplate() != nullptr ||
                        isa<ClassTemplatePartialSpecializationDecl>(CRD);
      for (const CXXBaseSpecifier &B : CRD->bases())
        Def->Bases.push_back(baseName(B.getType()));
      StringSet<> Seen;
      for (const Decl *Member : CRD->decls()) {
        const FunctionDecl *FD = dyn_cast<FunctionDecl>(Member);
        if (auto *FTD = dyn_cast<FunctionTemplateDecl>(Member))
          FD = FTD->getTemplatedDecl();
        if (!FD || FD->isImplicit() || !isa<CXXMethodDecl>(FD))
          continue;
        std::string Name = FD->getNameAsString();
        if (Seen.insert(Name).second)
          Def->Methods.push_back(std::move(Name));
      }
    }
    return true;
  }

  bool VisitFunctionDecl(FunctionDecl *FD) {
    if (FD->isImplicit() || FD->isTemplateInstantiation() ||
        FD->isDefaulted() || FD->isDeleted())
      return true;
    bool IsKernel = FD->hasAttr<CUDAGlobalAttr>();
    // Definitions only (a skipped body still counts), except that a kernel
    // declared but defined elsewhere is worth finding too.
    bool IsDefinition = FD->doesThisDeclarationHaveABody() || FD->hasSkippedBody();
    if (!IsDefinition && !IsKernel)
      return true;
    if (!IsDefinition && FD->getDefinition())
      return true;
    DefinitionKind K = IsKernel ? DefinitionKind::Kernel
                       : isa<CXXMethodDecl>(FD) ? DefinitionKind::Method
                                                : DefinitionKind::Function;
    const Decl *Span = FD;
    if (FunctionTemplateDecl *FTD = FD->getDescribedFunctionTemplate())
      Span = FTD;
    Definition *Def = record(FD, Span, K);
    if (!Def)
      return true;
    Def->IsTemplate = FD->getDescribedFunctionTemplate() != nullptr ||
                      FD->isDependentContext();
    Def->IsDeclaration = !IsDefinition;
    if (IsKernel && !Def->IsTemplate && !FD->isInvalidDecl()) {
      std::string Mangled;
      raw_string_ostream OS(Mangled);
      if (Mangler->shouldMangleDeclName(FD))
        Mangler->mangleName(GlobalDecl(FD, KernelReferenceKind::Kernel), OS);
      else
        OS << FD->getName();
      Def->MangledName = std::move(Mangled);
    }
    return true;
  }

private:
  /// The output slot of the claimed file that holds D, if any.
  std::optional<unsigned> fileSlot(const Decl *D) const {
    SourceLocation Loc = D->getLocation();
    if (Loc.isInvalid())
      return std::nullopt;
    FileID FID = SM.getFileID(SM.getExpansionLoc(Loc));
    auto It = Claimed.find(FID);
    if (It == Claimed.end())
      return std::nullopt;
    return It->second;
  }

  std::string baseName(QualType T) const {
    if (const CXXRecordDecl *RD = T->getAsCXXRecordDecl())
      return RD->getQualifiedNameAsString();
    if (const auto *TST = T->getAs<TemplateSpecializationType>())
      if (TemplateDecl *TD = TST->getTemplateName().getAsTemplateDecl())
        return TD->getQualifiedNameAsString();
    PrintingPolicy Policy(Ctx.getLangOpts());
    Policy.SuppressTagKeyword = true;
    return T.getAsString(Policy);
  }

  /// Where the body of a function whose body the parser skipped ends: the
  /// closing brace matching the first `{` after the declarator, stepping over
  /// a constructor's member initializers (`: a(1), b{2}`). Invalid when the
  /// declaration has no body to find.
  SourceLocation skippedBodyEnd(SourceLocation DeclEnd) const {
    FileID FID = SM.getFileID(DeclEnd);
    bool Invalid = false;
    SM.getBufferData(FID, &Invalid);
    if (Invalid)
      return {};
    DirectiveAwareLexer Stream(FID, SM, Ctx.getLangOpts(), SM.getFileOffset(DeclEnd));
    Token Tok;
    SmallVector<Conditional, 2> Conds;
    unsigned Depth = 0;
    BranchTracker<unsigned> Branches;
    // Advances; keeps Depth right across #if/#else branches that each open
    // a brace.
    auto Next = [&] {
      Conds.clear();
      bool More = Stream.next(Tok, Conds);
      for (Conditional C : Conds)
        Branches.apply(C, Depth);
      return More;
    };
    // Skips the balanced group that starts at the current token.
    auto SkipGroup = [&]() -> bool {
      tok::TokenKind Open = Tok.getKind();
      tok::TokenKind Close = Open == tok::l_brace   ? tok::r_brace
                             : Open == tok::l_paren ? tok::r_paren
                                                    : tok::r_square;
      Depth = 1;
      while (Next()) {
        if (Tok.is(Open))
          ++Depth;
        else if (Tok.is(Close) && --Depth == 0)
          return true;
      }
      return false;
    };
    Next(); // the last token of the declarator itself
    bool InInitializers = false;
    bool AfterGroup = false; // the previous token closed a (...) or {...}
    while (Next()) {
      if (Tok.isOneOf(tok::semi, tok::equal) && !InInitializers)
        return {};
      if (Tok.is(tok::colon) && !InInitializers) {
        InInitializers = true;
        AfterGroup = false;
        continue;
      }
      if (Tok.isOneOf(tok::l_paren, tok::l_square) ||
          (Tok.is(tok::l_brace) && InInitializers && !AfterGroup)) {
        // `noexcept(...)`, `[[attr]]`, or a member initializer `a(1)`, `b{2}`.
        if (!SkipGroup())
          return {};
        AfterGroup = true;
        continue;
      }
      if (Tok.is(tok::l_brace)) {
        if (!SkipGroup())
          return {};
        SourceLocation End = Tok.getLocation();
        // A function-try-block ends with its last handler:
        // `void f() try { ... } catch (E&) { ... }`.
        while (Next() && Tok.is(tok::raw_identifier) &&
               Tok.getRawIdentifier() == "catch") {
          if (!Next() || Tok.isNot(tok::l_paren) || !SkipGroup())
            break;
          if (!Next() || Tok.isNot(tok::l_brace) || !SkipGroup())
            break;
          End = Tok.getLocation();
        }
        return End;
      }
      AfterGroup = false;
    }
    return {};
  }

  /// Records D with the source span of SpanDecl (its template, if any).
  Definition *record(const NamedDecl *D, const Decl *SpanDecl,
                     DefinitionKind Kind) {
    std::optional<unsigned> Slot = fileSlot(D);
    if (!Slot)
      return nullptr;
    SourceRange R = SpanDecl->getSourceRange();
    SourceLocation Begin = SM.getExpansionLoc(R.getBegin());
    SourceLocation End = SM.getExpansionRange(R.getEnd()).getEnd();
    // The parser skipped the body, so the range ends at the declarator;
    // find the body's closing brace (unless a macro wrote the definition,
    // whose invocation is the whole span).
    if (auto *FD = dyn_cast<FunctionDecl>(D))
      if (FD->hasSkippedBody() && !R.getEnd().isMacroID())
        if (SourceLocation BodyEnd = skippedBodyEnd(End); BodyEnd.isValid())
          End = BodyEnd;
    End = Lexer::getLocForEndOfToken(End, 0, SM, Ctx.getLangOpts());
    FileID FID = SM.getFileID(Begin);
    if (Begin.isInvalid() || End.isInvalid() || SM.getFileID(End) != FID ||
        Claimed.lookup(FID) != *Slot)
      return nullptr;

    Definition Def;
    Def.Name = D->getNameAsString();
    Def.QualifiedName = D->getQualifiedNameAsString();
    Def.Kind = Kind;
    Def.ByteStart = SM.getFileOffset(Begin);
    Def.ByteEnd = SM.getFileOffset(End);
    if (Def.ByteEnd < Def.ByteStart)
      return nullptr;
    Def.LineStart = SM.getLineNumber(FID, Def.ByteStart);
    Def.LineEnd = SM.getLineNumber(FID, Def.ByteEnd ? Def.ByteEnd - 1 : 0);
    SmallString<128> USR;
    if (!index::generateUSRForDecl(D, USR))
      Def.USR = USR.str().str();
    auto &Defs = Out.Files[*Slot].Definitions.Definitions;
    Defs.push_back(std::move(Def));
    return &Defs.back();
  }

  ASTContext &Ctx;
  SourceManager &SM;
  const ClaimedFiles &Claimed;
  CxxTranslationUnit &Out;
  std::unique_ptr<MangleContext> Mangler;
};

class IndexConsumer : public ASTConsumer {
public:
  IndexConsumer(function_ref<bool(StringRef)> Claim,
                CxxTranslationUnit &Out)
      : Claim(Claim), Out(Out) {}

  void HandleTranslationUnit(ASTContext &Ctx) override {
    SourceManager &SM = Ctx.getSourceManager();
    // Claim the files of this translation unit that nobody indexed yet. The
    // main file comes first so that its entry carries the error count.
    ClaimedFiles Claimed;
    auto ClaimFile = [&](FileID FID) {
      OptionalFileEntryRef FE = SM.getFileEntryRefForID(FID);
      if (!FE || Claimed.count(FID))
        return;
      StringRef Real = FE->getFileEntry().tryGetRealPathName();
      std::string Path = Real.empty() ? FE->getName().str() : Real.str();
      if (!Claim(Path))
        return;
      Claimed[FID] = unsigned(Out.Files.size());
      Out.Files.push_back({std::move(Path), {}});
    };
    ClaimFile(SM.getMainFileID());
    StringSet<> Seen;
    for (unsigned I = 1, E = SM.local_sloc_entry_size(); I < E; ++I) {
      const SrcMgr::SLocEntry &Entry = SM.getLocalSLocEntry(I);
      if (!Entry.isFile() || !Entry.getFile().getIncludeLoc().isValid())
        continue;
      FileID FID = SM.getFileID(SourceLocation::getFromRawEncoding(Entry.getOffset()));
      if (OptionalFileEntryRef FE = SM.getFileEntryRefForID(FID)) {
        StringRef Real = FE->getFileEntry().tryGetRealPathName();
        if (!Real.empty() && Seen.insert(Real).second)
          Out.Includes.push_back(Real.str());
      }
      ClaimFile(FID);
    }
    if (Claimed.empty())
      return;
    DefinitionCollector(Ctx, Claimed, Out).TraverseDecl(Ctx.getTranslationUnitDecl());
    for (const auto &[FID, Slot] : Claimed)
      recoverDefinitionsMissedByParser(FID, SM, Ctx.getLangOpts(),
                               Out.Files[Slot].Definitions.Definitions);
  }

private:
  function_ref<bool(StringRef)> Claim;
  CxxTranslationUnit &Out;
};

/// Records where each `#include` looked without finding its file, in the
/// order Clang's header search tries: the includer's directory (quoted
/// forms), then the -I directories. System directories are left out: no
/// indexed file appears there.
class IncludeMissRecorder : public PPCallbacks {
public:
  IncludeMissRecorder(const SourceManager &SM, HeaderSearch &HS, CxxTranslationUnit &Out)
      : SM(SM), HS(HS), Out(Out) {}

  void InclusionDirective(SourceLocation HashLoc, const Token &IncludeTok, StringRef FileName,
                          bool IsAngled, CharSourceRange, OptionalFileEntryRef File,
                          StringRef SearchPath, StringRef, const Module *, bool,
                          SrcMgr::CharacteristicKind) override {
    if (sys::path::is_absolute(FileName) || (File && SearchPath.empty()))
      return;
    OptionalDirectoryEntryRef Found;
    if (File)
      Found = HS.getFileMgr().getOptionalDirectoryRef(SearchPath);
    // Stops at the directory the file was found in; false then.
    auto Miss = [&](DirectoryEntryRef Dir) {
      if (Found && &Found->getDirEntry() == &Dir.getDirEntry())
        return false;
      SmallString<256> Path(realDir(Dir.getName()));
      sys::path::append(Path, FileName);
      sys::path::remove_dots(Path, /*remove_dot_dot=*/true);
      if (Seen.insert(Path).second)
        Out.IncludeMisses.push_back(Path.str().str());
      return true;
    };
    // #include_next starts after the includer's own directory: taking the
    // whole list only records more than needed.
    if (!IsAngled && IncludeTok.getIdentifierInfo() &&
        IncludeTok.getIdentifierInfo()->getName() != "include_next")
      if (OptionalFileEntryRef Includer = SM.getFileEntryRefForID(SM.getFileID(HashLoc)))
        if (!Miss(Includer->getDir()))
          return;
    for (auto It = IsAngled ? HS.angled_dir_begin() : HS.search_dir_begin();
         It != HS.search_dir_end(); ++It) {
      OptionalDirectoryEntryRef Dir = It->getDirRef();
      if (!Dir || It->getDirCharacteristic() != SrcMgr::C_User)
        continue;
      if (!Miss(*Dir))
        return;
    }
  }

private:
  StringRef realDir(StringRef Dir) {
    auto [It, New] = RealDirs.try_emplace(Dir);
    if (New) {
      SmallString<256> Real;
      It->second = sys::fs::real_path(Dir, Real) ? Dir.str() : Real.str().str();
    }
    return It->second;
  }

  const SourceManager &SM;
  HeaderSearch &HS;
  CxxTranslationUnit &Out;
  StringMap<std::string> RealDirs;
  StringSet<> Seen;
};

/// Stops a unit's template instantiations once its AST passes a limit.
/// Sema instantiates nothing after a fatal error (with an error that stops
/// compilation, which a fatal one of Clang's own is), and the rest of the
/// file is still parsed: definitions after the limit are still found.
/// Counted by the AST's bytes, so the same on any machine and under any
/// load.
class InstantiationLimit : public TemplateInstantiationCallback {
public:
  InstantiationLimit(uint64_t Limit, bool &Stopped) : Limit(Limit), Stopped(Stopped) {}

  void initialize(const Sema &) override {}
  void finalize(const Sema &) override {}
  void atTemplateEnd(const Sema &, const Sema::CodeSynthesisContext &) override {}
  void atTemplateBegin(const Sema &S, const Sema::CodeSynthesisContext &Inst) override {
    // The AST's size is the sum of its allocator's slabs: looked at every
    // 64 instantiations, not each.
    if (Stopped || ++Count % 64 != 0 ||
        S.getASTContext().getASTAllocatedMemory() <= Limit)
      return;
    Stopped = true;
    S.getDiagnostics().Report(Inst.PointOfInstantiation, diag::fatal_too_many_errors);
  }

private:
  uint64_t Limit;
  bool &Stopped;
  uint64_t Count = 0;
};

class IndexAction : public ASTFrontendAction {
public:
  IndexAction(function_ref<bool(StringRef)> Claim, uint64_t MaxASTMemory,
              CxxTranslationUnit &Out)
      : Claim(Claim), MaxASTMemory(MaxASTMemory), Out(Out) {}

  std::unique_ptr<ASTConsumer> CreateASTConsumer(CompilerInstance &,
                                                 StringRef) override {
    return std::make_unique<IndexConsumer>(Claim, Out);
  }

  bool BeginSourceFileAction(CompilerInstance &CI) override {
    // A missing header is fatal by default, and after a fatal error Sema
    // stops instantiating templates, so `struct S : Base<float>` would lose
    // its base. Without a compilation database headers do go missing; make
    // that an ordinary, recoverable error.
    CI.getDiagnostics().setSeverity(diag::err_pp_file_not_found,
                                    diag::Severity::Error, SourceLocation());
    Preprocessor &PP = CI.getPreprocessor();
    PP.addPPCallbacks(
        std::make_unique<IncludeMissRecorder>(CI.getSourceManager(), PP.getHeaderSearchInfo(), Out));
    return true;
  }

  void ExecuteAction() override {
    // Sema is made here, not by the action, to carry the limit.
    CompilerInstance &CI = getCompilerInstance();
    if (!CI.hasSema())
      CI.createSema(getTranslationUnitKind(), nullptr);
    CI.getSema().TemplateInstCallbacks.push_back(
        std::make_unique<InstantiationLimit>(MaxASTMemory, Out.StoppedInstantiating));
    ASTFrontendAction::ExecuteAction();
  }

private:
  function_ref<bool(StringRef)> Claim;
  uint64_t MaxASTMemory;
  CxxTranslationUnit &Out;
};

/// Runs IndexAction with the lenient frontend settings an index wants.
class IndexActionFactory : public tooling::FrontendActionFactory {
public:
  IndexActionFactory(function_ref<bool(StringRef)> Claim, uint64_t MaxASTMemory,
                     CxxTranslationUnit &Out)
      : Claim(Claim), MaxASTMemory(MaxASTMemory), Out(Out) {}

  std::unique_ptr<FrontendAction> create() override {
    return std::make_unique<IndexAction>(Claim, MaxASTMemory, Out);
  }

  bool runInvocation(std::shared_ptr<CompilerInvocation> Invocation,
                     FileManager *Files,
                     std::shared_ptr<PCHContainerOperations> PCH,
                     DiagnosticConsumer *Diags) override {
    // Bodies are what make parsing slow, and an index of declarations does
    // not need them; a skipped body still ends the declaration's range.
    Invocation->getFrontendOpts().SkipFunctionBodies = true;
    // Keep going after any number of errors, a missing header included.
    Invocation->getDiagnosticOpts().ErrorLimit = 0;
    Invocation->getLangOpts().SpellChecking = false;
    return FrontendActionFactory::runInvocation(std::move(Invocation), Files,
                                                std::move(PCH), Diags);
  }

private:
  function_ref<bool(StringRef)> Claim;
  uint64_t MaxASTMemory;
  CxxTranslationUnit &Out;
};

/// Builds the precompiled prelude, with the same lenient settings as the
/// translation units that will load it.
class PrecompileFactory : public tooling::FrontendActionFactory {
public:
  explicit PrecompileFactory(StringRef Output) : Output(Output) {}

  std::unique_ptr<FrontendAction> create() override {
    return std::make_unique<GeneratePCHAction>();
  }

  bool runInvocation(std::shared_ptr<CompilerInvocation> Invocation,
                     FileManager *Files,
                     std::shared_ptr<PCHContainerOperations> PCH,
                     DiagnosticConsumer *Diags) override {
    Invocation->getFrontendOpts().SkipFunctionBodies = true;
    Invocation->getFrontendOpts().OutputFile = Output;
    Invocation->getFrontendOpts().ProgramAction = frontend::GeneratePCH;
    Invocation->getLangOpts().SpellChecking = false;
    return FrontendActionFactory::runInvocation(std::move(Invocation), Files,
                                                std::move(PCH), Diags);
  }

private:
  std::string Output;
};

/// The real file system, where only what the walk would index is opened:
/// regular files, and sources no larger than the build's limit. Clang reads
/// a FIFO to its end, so `#include "x.h"` with x.h a FIFO would wait for a
/// writer for good; a device may never end; a generated 50 MB source takes
/// Clang minutes. To the units that include them, these are missing headers.
class IndexableFilesOnly : public vfs::ProxyFileSystem {
public:
  IndexableFilesOnly(IntrusiveRefCntPtr<vfs::FileSystem> FS, uint64_t MaxSourceSize)
      : ProxyFileSystem(std::move(FS)), MaxSourceSize(MaxSourceSize) {}

  ErrorOr<std::unique_ptr<vfs::File>> openFileForRead(const Twine &Path) override {
    ErrorOr<vfs::Status> St = status(Path);
    if (St && !St->isRegularFile() && !St->isDirectory())
      return std::make_error_code(std::errc::operation_not_supported);
    if (St && St->getSize() > MaxSourceSize && languageForPath(Path.str()))
      return std::make_error_code(std::errc::file_too_large);
    return ProxyFileSystem::openFileForRead(Path);
  }

private:
  uint64_t MaxSourceSize;
};

/// A file manager over the real file system with the prelude laid over it.
IntrusiveRefCntPtr<FileManager> makeFileManager(uint64_t MaxSourceSize) {
  auto Memory = makeIntrusiveRefCnt<vfs::InMemoryFileSystem>();
  Memory->addFile(PreludePath, 0,
                  MemoryBuffer::getMemBuffer(cudaPrelude(), PreludePath));
  Memory->addFile(PCHSourcePath, 0,
                  MemoryBuffer::getMemBuffer(PCHSource, PCHSourcePath));
  auto Overlay = makeIntrusiveRefCnt<vfs::OverlayFileSystem>(
      makeIntrusiveRefCnt<IndexableFilesOnly>(vfs::getRealFileSystem(), MaxSourceSize));
  Overlay->pushOverlay(Memory);
  return makeIntrusiveRefCnt<FileManager>(FileSystemOptions(), Overlay);
}

} // namespace

CxxIndexer::~CxxIndexer() = default;

FileManager &CxxIndexer::threadFileManager() {
  // One per thread (a FileManager is not thread-safe) and per indexer: it
  // caches stat results and identifies files by inode, which must not outlive
  // one build of a tree that changes between builds.
  std::lock_guard<std::mutex> Lock(FileManagersMutex);
  auto &Files = FileManagers[std::this_thread::get_id()];
  if (!Files)
    Files = makeFileManager(Options.MaxSourceSize);
  return *Files;
}

CxxIndexer::CxxIndexer(CxxIndexerOptions Opts) : Options(std::move(Opts)) {
  if (Options.ResourceDir.empty())
    Options.ResourceDir = EKKA_CLANG_RESOURCE_DIR;
}

std::vector<std::string> CxxIndexer::commandLine(StringRef MainFile,
                                                 SourceLanguage Language) const {
  std::vector<std::string> Args = {"clang++", "-fsyntax-only", "-w",
                                   "-ferror-limit=0",
                                   "-resource-dir=" + Options.ResourceDir};
  switch (Language) {
  case SourceLanguage::C:
    Args.insert(Args.end(), {"-x", "c", "-std=gnu11"});
    break;
  default:
    // Every C++ file is read as CUDA: a header ending in .h may hold kernels,
    // and CUDA mode is a superset of C++ for declarations.
    Args.insert(Args.end(), {"-x", "cuda", "--cuda-host-only", "-nocudainc",
                             "-nocudalib", "--no-cuda-version-check",
                             "-std=c++17"});
    for (const char *Macro : FeatureMacros)
      Args.push_back(std::string("-D") + Macro);
    if (!PrecompiledPrelude.empty())
      Args.insert(Args.end(), {"-include-pch", PrecompiledPrelude});
    else
      Args.insert(Args.end(), {"-include", PreludePath});
    break;
  }
  for (const std::string &Dir : Options.IncludeDirs)
    Args.push_back("-I" + Dir);
  Args.insert(Args.end(), Options.ExtraArgs.begin(), Options.ExtraArgs.end());
  Args.push_back(MainFile.str());
  return Args;
}

bool CxxIndexer::precompilePrelude(StringRef PCHPath) {
  std::string Saved = std::move(PrecompiledPrelude);
  PrecompiledPrelude.clear();
  std::vector<std::string> Args = commandLine(PCHSourcePath, SourceLanguage::Cuda);
  // Without the prelude itself: the PCH source includes it.
  auto Include = llvm::find(Args, "-include");
  if (Include != Args.end())
    Args.erase(Include, Include + 2);
  PrecompileFactory Factory(PCHPath);
  CountingDiagConsumer Diags;
  tooling::ToolInvocation Invocation(std::move(Args), &Factory,
                                     &threadFileManager(),
                                     std::make_shared<PCHContainerOperations>());
  Invocation.setDiagnosticConsumer(&Diags);
  bool OK = Invocation.run() && Diags.Errors == 0 && sys::fs::exists(PCHPath);
  PrecompiledPrelude = OK ? PCHPath.str() : Saved;
  return OK;
}

CxxTranslationUnit
CxxIndexer::indexTranslationUnit(StringRef MainFile, SourceLanguage Language,
                                 function_ref<bool(StringRef)> Claim) {
  CxxTranslationUnit Out;
  IndexActionFactory Factory(Claim, Options.MaxASTMemory, Out);
  CountingDiagConsumer Diags;
  tooling::ToolInvocation Invocation(commandLine(MainFile, Language), &Factory,
                                     &threadFileManager(),
                                     std::make_shared<PCHContainerOperations>());
  Invocation.setDiagnosticConsumer(&Diags);
  Invocation.run();
  Out.ParseErrors = Diags.Errors;
  // The main file, if wanted, is claimed first.
  if (!Out.Files.empty())
    Out.Files.front().Definitions.ParseErrors = Diags.Errors;
  return Out;
}

} // namespace ekka
