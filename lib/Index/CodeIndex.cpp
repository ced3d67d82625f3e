//===- CodeIndex.cpp - The SQLite code index and its queries -------------===//
#include "ekka/Index/CodeIndex.h"
#include "ekka/Config.h"
#include "ekka/Index/KernelSymbol.h"
#include "ekka/Index/SubclassResolver.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/JSON.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"

#include <cerrno>
#include <deque>
#include <set>
#include <tuple>
#include <signal.h>

using namespace llvm;

namespace ekka {

namespace {

constexpr const char *Schema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS files(
  id INTEGER PRIMARY KEY,
  path TEXT NOT NULL UNIQUE,
  language TEXT NOT NULL,
  module TEXT,
  size INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL,
  hash TEXT,
  status TEXT NOT NULL,
  parse_errors INTEGER NOT NULL DEFAULT 0,
  recorded_by TEXT,
  text BLOB);
-- What each C++ translation unit included, to re-parse it when one changes.
CREATE TABLE IF NOT EXISTS file_includes(
  file_id INTEGER NOT NULL REFERENCES files(id),
  included_path TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS file_includes_path ON file_includes(included_path);
CREATE INDEX IF NOT EXISTS file_includes_file ON file_includes(file_id);
-- Where each C++ translation unit's #includes looked in vain before finding
-- their files: a file created there changes what the unit includes.
CREATE TABLE IF NOT EXISTS include_misses(
  file_id INTEGER NOT NULL REFERENCES files(id),
  path TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS include_misses_path ON include_misses(path);
CREATE INDEX IF NOT EXISTS include_misses_file ON include_misses(file_id);
CREATE TABLE IF NOT EXISTS definitions(
  id INTEGER PRIMARY KEY,
  file_id INTEGER NOT NULL REFERENCES files(id),
  name TEXT NOT NULL,
  qualified_name TEXT NOT NULL,
  language TEXT NOT NULL,
  kind TEXT NOT NULL,
  line_start INTEGER NOT NULL,
  line_end INTEGER NOT NULL,
  byte_start INTEGER NOT NULL,
  byte_end INTEGER NOT NULL,
  bases TEXT NOT NULL DEFAULT '[]',
  methods TEXT NOT NULL DEFAULT '[]',
  decorators TEXT NOT NULL DEFAULT '[]',
  is_async INTEGER NOT NULL DEFAULT 0,
  is_template INTEGER NOT NULL DEFAULT 0,
  found_by TEXT NOT NULL DEFAULT 'parser',
  is_declaration INTEGER NOT NULL DEFAULT 0,
  usr TEXT,
  mangled_name TEXT);
CREATE INDEX IF NOT EXISTS definitions_name ON definitions(name);
CREATE INDEX IF NOT EXISTS definitions_qualified_name ON definitions(qualified_name);
CREATE INDEX IF NOT EXISTS definitions_mangled_name ON definitions(mangled_name);
CREATE INDEX IF NOT EXISTS definitions_file ON definitions(file_id);
-- The same declaration seen twice (through two includes) is stored once.
CREATE UNIQUE INDEX IF NOT EXISTS definitions_usr
  ON definitions(file_id, usr, line_start) WHERE usr IS NOT NULL;
CREATE TABLE IF NOT EXISTS imports(
  file_id INTEGER NOT NULL REFERENCES files(id),
  alias TEXT NOT NULL,
  target TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS imports_file ON imports(file_id);
CREATE TABLE IF NOT EXISTS subclass_links(
  base_id INTEGER NOT NULL REFERENCES definitions(id),
  sub_id INTEGER NOT NULL REFERENCES definitions(id),
  base_text TEXT NOT NULL,
  how TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS subclass_links_base ON subclass_links(base_id);
)sql";

constexpr const char *DefinitionColumns =
    "d.id, d.name, d.qualified_name, d.kind, d.line_start, d.line_end, "
    "d.byte_start, d.byte_end, d.bases, d.methods, d.decorators, d.is_async, "
    "d.is_template, d.usr, d.mangled_name, f.path, d.language, d.found_by, "
    "d.is_declaration, "
    "substr(f.text, d.byte_start + 1, d.byte_end - d.byte_start)";

std::string toJSONList(const std::vector<std::string> &Items) {
  json::Array A;
  for (const std::string &S : Items)
    A.push_back(S);
  std::string Out;
  raw_string_ostream OS(Out);
  OS << json::Value(std::move(A));
  return Out;
}

std::vector<std::string> fromJSONList(StringRef Text) {
  std::vector<std::string> Out;
  Expected<json::Value> V = parseJSON(Text);
  if (!V) {
    consumeError(V.takeError());
    return Out;
  }
  if (const json::Array *A = V->getAsArray())
    for (const json::Value &E : *A)
      if (auto S = E.getAsString())
        Out.push_back(S->str());
  return Out;
}

DefinitionKind parseKind(StringRef K) {
  return StringSwitch<DefinitionKind>(K)
      .Case("namespace", DefinitionKind::Namespace)
      .Case("class", DefinitionKind::Class)
      .Case("struct", DefinitionKind::Struct)
      .Case("union", DefinitionKind::Union)
      .Case("method", DefinitionKind::Method)
      .Case("kernel", DefinitionKind::Kernel)
      .Case("op", DefinitionKind::Op)
      .Default(DefinitionKind::Function);
}

/// \p Text as a GLOB pattern that matches only itself: GLOB has no escape
/// character, but a bracket expression of one character is literal.
std::string globLiteral(StringRef Text) {
  std::string P;
  for (char C : Text) {
    if (C == '*' || C == '?' || C == '[' || C == ']')
      P += std::string("[") + C + "]";
    else
      P += C;
  }
  return P;
}

std::string likePattern(StringRef Text) {
  std::string P = "%";
  for (char C : Text) {
    if (C == '%' || C == '_' || C == '\\')
      P += '\\';
    P += C;
  }
  return P + "%";
}

/// Whether a decorator (as written, without the `@`) makes a Triton kernel:
/// `triton.jit`, `triton.autotune(...)`, `triton.heuristics(...)`, or the
/// same imported bare (`from triton import jit`).
bool isTritonDecorator(const std::string &Decorator) {
  StringRef Callee = StringRef(Decorator).split('(').first.trim();
  Callee.consume_front("triton.");
  return Callee == "jit" || Callee == "autotune" || Callee == "heuristics";
}

/// Removes INDEX.tmp-PID files left by builds that were killed (their PID is
/// gone), so a crash leaves no lasting litter next to the index.
void removeStaleTemporaries(StringRef Path) {
  StringRef Dir = sys::path::parent_path(Path);
  std::string Prefix = (sys::path::filename(Path) + ".tmp-").str();
  std::error_code EC;
  for (sys::fs::directory_iterator It(Dir.empty() ? "." : Dir, EC), End;
       It != End && !EC; It.increment(EC)) {
    StringRef Name = sys::path::filename(It->path());
    int Pid = 0;
    if (!Name.consume_front(Prefix) || Name.getAsInteger(10, Pid) || Pid <= 0)
      continue;
    if (::kill(Pid, 0) != 0 && errno == ESRCH)
      sys::fs::remove(It->path());
  }
}

} // namespace

Expected<std::unique_ptr<CodeIndex>> CodeIndex::openForWriting(StringRef Path) {
  // A new index is written to a temporary file beside it and renamed into
  // place by finish(): no journal or sync is needed (a crash leaves no half
  // index behind), which makes a cold build's writes several times faster.
  uint64_t ExistingSize = 0;
  bool Fresh = sys::fs::file_size(Path, ExistingSize) || ExistingSize == 0;
  StringRef Parent = sys::path::parent_path(Path);
  if (!Parent.empty() && !sys::fs::is_directory(Parent))
    return makeError("cannot write index '" + Path + "': directory '" + Parent +
                     "' does not exist");
  removeStaleTemporaries(Path);
  // An index of another format of ours is built afresh and replaces it:
  // what it holds is derived from the sources, and it cannot be updated.
  if (!Fresh) {
    if (auto Old = SQLiteDatabase::open(Path, SQLiteDatabase::Mode::ReadOnly)) {
      CodeIndex Existing(std::move(*Old));
      Fresh = Existing.otherFormat();
    } else {
      consumeError(Old.takeError());
    }
  }
  std::string WritePath =
      Fresh ? (Path + ".tmp-" + Twine(sys::Process::getProcessId())).str() : Path.str();
  auto Db = SQLiteDatabase::open(WritePath, SQLiteDatabase::Mode::ReadWriteCreate);
  if (!Db) {
    consumeError(Db.takeError());
    return makeError("cannot write index '" + Path + "'");
  }
  std::unique_ptr<CodeIndex> Index(new CodeIndex(std::move(*Db)));
  if (Fresh) {
    Index->TempPath = WritePath;
    Index->FinalPath = Path.str();
    if (Error E = Index->Db->exec("PRAGMA page_size=65536; PRAGMA journal_mode=OFF; "
                                  "PRAGMA synchronous=OFF"))
      return E;
  } else {
    // A file that is there must be an index of ours; it is never overwritten.
    auto NotAnIndex = [&](Error E) {
      consumeError(std::move(E));
      return makeError("'" + Path + "' is not an Ekka code index (" +
                       Index->Db->lastMessage() + ")");
    };
    auto Tables = Index->Db->prepare("SELECT count(*) FROM sqlite_master");
    if (!Tables)
      return NotAnIndex(Tables.takeError());
    Expected<bool> Row = Tables->step();
    if (!Row)
      return NotAnIndex(Row.takeError());
    bool Empty = Tables->columnInt(0) == 0;
    *Tables = SQLiteStatement();
    if (Empty)
      return makeError("'" + Path + "' is not an Ekka code index (an SQLite "
                       "database without its tables)");
    if (Error E = Index->checkFormat())
      return E;
    if (Error E = Index->Db->exec("PRAGMA synchronous=NORMAL"))
      return E;
  }
  if (Error E = Index->createSchema())
    return E;
  return Index;
}

CodeIndex::~CodeIndex() {
  if (!TempPath.empty()) {
    Statements.clear();
    Db.reset();
    sys::fs::remove(TempPath);
  }
}

Error CodeIndex::finish() {
  if (TempPath.empty())
    return Error::success();
  Statements.clear();
  Db.reset();
  if (std::error_code EC = sys::fs::rename(TempPath, FinalPath)) {
    sys::fs::remove(TempPath);
    TempPath.clear();
    return makeError("cannot write '" + FinalPath + "': " + EC.message());
  }
  TempPath.clear();
  return Error::success();
}

Expected<std::unique_ptr<CodeIndex>> CodeIndex::openForReading(StringRef Path) {
  auto Db = SQLiteDatabase::open(Path, SQLiteDatabase::Mode::ReadOnly);
  if (!Db)
    return Db.takeError();
  std::unique_ptr<CodeIndex> Index(new CodeIndex(std::move(*Db)));
  if (Error E = Index->checkFormat())
    return E;
  return Index;
}

bool CodeIndex::otherFormat() {
  auto S = Db->prepare("SELECT value FROM meta WHERE key = 'format'");
  if (!S) {
    consumeError(S.takeError());
    return false;
  }
  Expected<bool> Row = S->step();
  if (!Row) {
    consumeError(Row.takeError());
    return false;
  }
  auto [Kind, Version] = S->columnText(0).split(' ');
  int Major = 0;
  return *Row && Kind == "ekka-index" && !Version.getAsInteger(10, Major) &&
         Major != FormatVersion;
}

Error CodeIndex::checkFormat() {
  auto Fail = [&](const Twine &Why) {
    return makeError("'" + Db->path() + "' is not an Ekka code index (" + Why + ")");
  };
  auto S = Db->prepare("SELECT value FROM meta WHERE key = 'format'");
  if (!S) {
    consumeError(S.takeError());
    return Fail(Db->lastMessage());
  }
  Expected<bool> Row = S->step();
  if (!Row) {
    consumeError(Row.takeError());
    return Fail(Db->lastMessage());
  }
  if (!*Row)
    return Fail("no format version");
  StringRef Value = S->columnText(0);
  StringRef Kind = Value.split(' ').first;
  int Major = 0;
  if (Kind != "ekka-index" || Value.split(' ').second.getAsInteger(10, Major))
    return Fail("format '" + Value + "'");
  if (Major != FormatVersion)
    return makeError("'" + Db->path() + "' has index format " + Twine(Major) +
                     "; this ekka-index reads format " + Twine(FormatVersion) +
                     " (rebuild it: ekka-index build REPO... -o " + Db->path() +
                     " replaces it)");
  return Error::success();
}

Error CodeIndex::createSchema() {
  if (Error E = Db->exec(Schema))
    return E;
  if (Error E = setMeta("format", "ekka-index " + std::to_string(FormatVersion)))
    return E;
  return setMeta("tool_version", EKKA_VERSION);
}

Error CodeIndex::setMeta(StringRef Key, StringRef Value) {
  auto S = Db->prepare("INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)");
  if (!S)
    return S.takeError();
  return S->bind(1, Key).bind(2, Value).run();
}

Expected<std::string> CodeIndex::meta(StringRef Key) {
  auto S = Db->prepare("SELECT value FROM meta WHERE key = ?1");
  if (!S)
    return S.takeError();
  std::string Value;
  if (Error E = S->bind(1, Key).forEachRow(
          [&](const SQLiteStatement &R) { Value = R.columnText(0).str(); }))
    return E;
  return Value;
}

Error CodeIndex::beginBatch() { return Db->exec("BEGIN"); }
Error CodeIndex::commitBatch() { return Db->exec("COMMIT"); }

Expected<StringMap<IndexedFileState>> CodeIndex::fileStates() {
  StringMap<IndexedFileState> States;
  auto S = Db->prepare("SELECT path, size, mtime_ns, hash, status, module, recorded_by FROM files");
  if (!S)
    return S.takeError();
  if (Error E = S->forEachRow([&](const SQLiteStatement &R) {
        IndexedFileState &St = States[R.columnText(0)];
        St.Size = uint64_t(R.columnInt(1));
        St.MTimeNs = R.columnInt(2);
        St.Hash = R.columnText(3).str();
        St.Status = R.columnText(4).str();
        St.Module = R.columnText(5).str();
        St.RecordedBy = R.columnText(6).str();
      }))
    return E;
  return States;
}

Expected<SQLiteStatement *> CodeIndex::cached(StringRef SQL) {
  auto It = Statements.find(SQL);
  if (It != Statements.end()) {
    It->second.reset();
    return &It->second;
  }
  auto S = Db->prepare(SQL);
  if (!S)
    return S.takeError();
  return &(Statements[SQL] = std::move(*S));
}

Expected<int64_t> CodeIndex::fileId(StringRef Path) {
  auto S = cached("SELECT id FROM files WHERE path = ?1");
  if (!S)
    return S.takeError();
  (*S)->bind(1, Path);
  Expected<bool> Row = (*S)->step();
  if (!Row)
    return Row.takeError();
  int64_t Id = *Row ? (*S)->columnInt(0) : -1;
  (*S)->reset();
  return Id;
}

Error CodeIndex::deleteFileContents(int64_t Id, bool KeepIncludes) {
  for (const char *SQL : {"DELETE FROM definitions WHERE file_id = ?1",
                          "DELETE FROM imports WHERE file_id = ?1",
                          "DELETE FROM file_includes WHERE file_id = ?1",
                          "DELETE FROM include_misses WHERE file_id = ?1"}) {
    if (KeepIncludes && StringRef(SQL).contains("include"))
      continue;
    auto S = cached(SQL);
    if (!S)
      return S.takeError();
    if (Error E = (*S)->bind(1, Id).run())
      return E;
  }
  return Error::success();
}

Error CodeIndex::storeSkippedFile(const IndexedFile &F) {
  return storeFile(F, StringRef(), FileDefinitions());
}

Error CodeIndex::storeFile(const IndexedFile &F, StringRef Text,
                           const FileDefinitions &Defs) {
  Expected<int64_t> Existing = fileId(F.Path);
  if (!Existing)
    return Existing.takeError();
  if (*Existing >= 0)
    if (Error E = deleteFileContents(*Existing, F.KeepIncludes))
      return E;
  auto Up = cached(
      "INSERT INTO files(path, language, module, size, mtime_ns, hash, status, "
      "parse_errors, text, recorded_by) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) "
      "ON CONFLICT(path) DO UPDATE SET language = ?2, module = ?3, size = ?4, "
      "mtime_ns = ?5, hash = ?6, status = ?7, parse_errors = ?8, text = ?9, "
      "recorded_by = ?10");
  if (!Up)
    return Up.takeError();
  (*Up)->bind(1, F.Path).bind(2, languageName(F.Language)).bind(4, int64_t(F.Size));
  (*Up)->bind(5, F.MTimeNs).bind(6, F.Hash).bind(7, F.Status);
  (*Up)->bind(8, int64_t(Defs.ParseErrors));
  if (F.Module.empty())
    (*Up)->bindNull(3);
  else
    (*Up)->bind(3, F.Module);
  // Only files with definitions keep their text: it is what sources are cut
  // from.
  if (Defs.Definitions.empty())
    (*Up)->bindNull(9);
  else
    (*Up)->bindBlob(9, Text);
  if (F.RecordedBy.empty())
    (*Up)->bindNull(10);
  else
    (*Up)->bind(10, F.RecordedBy);
  if (Error E = (*Up)->run())
    return E;
  Expected<int64_t> Id = fileId(F.Path);
  if (!Id)
    return Id.takeError();

  auto Ins = cached(
      "INSERT OR IGNORE INTO definitions(file_id, name, qualified_name, language, "
      "kind, line_start, line_end, byte_start, byte_end, bases, methods, "
      "decorators, is_async, is_template, usr, mangled_name, found_by, "
      "is_declaration) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
      "?13, ?14, ?15, ?16, ?17, ?18)");
  if (!Ins)
    return Ins.takeError();
  for (const Definition &D : Defs.Definitions) {
    (*Ins)->bind(1, *Id).bind(2, D.Name).bind(3, D.QualifiedName);
    (*Ins)->bind(4, languageName(F.Language)).bind(5, kindName(D.Kind));
    (*Ins)->bind(6, int64_t(D.LineStart)).bind(7, int64_t(D.LineEnd));
    (*Ins)->bind(8, int64_t(D.ByteStart)).bind(9, int64_t(D.ByteEnd));
    (*Ins)->bind(10, toJSONList(D.Bases)).bind(11, toJSONList(D.Methods));
    (*Ins)->bind(12, toJSONList(D.Decorators));
    (*Ins)->bind(13, int64_t(D.IsAsync)).bind(14, int64_t(D.IsTemplate));
    if (D.USR.empty())
      (*Ins)->bindNull(15);
    else
      (*Ins)->bind(15, D.USR);
    if (D.MangledName.empty())
      (*Ins)->bindNull(16);
    else
      (*Ins)->bind(16, D.MangledName);
    (*Ins)->bind(17, D.FoundByLexer ? "lexer" : "parser");
    (*Ins)->bind(18, int64_t(D.IsDeclaration));
    if (Error E = (*Ins)->run())
      return E;
  }
  auto Imp = cached("INSERT INTO imports(file_id, alias, target) VALUES(?1, ?2, ?3)");
  if (!Imp)
    return Imp.takeError();
  for (const ImportBinding &B : Defs.Imports)
    if (Error E = (*Imp)->bind(1, *Id).bind(2, B.Alias).bind(3, B.Target).run())
      return E;
  auto Inc = cached("INSERT INTO file_includes(file_id, included_path) VALUES(?1, ?2)");
  if (!Inc)
    return Inc.takeError();
  for (const std::string &P : F.Includes)
    if (Error E = (*Inc)->bind(1, *Id).bind(2, P).run())
      return E;
  auto Miss = cached("INSERT INTO include_misses(file_id, path) VALUES(?1, ?2)");
  if (!Miss)
    return Miss.takeError();
  for (const std::string &P : F.IncludeMisses)
    if (Error E = (*Miss)->bind(1, *Id).bind(2, P).run())
      return E;
  return Error::success();
}

namespace {
/// Runs a one-column query once per key and collects the distinct results.
Expected<std::vector<std::string>> collectPerKey(SQLiteDatabase &Db, StringRef SQL,
                                                 const std::vector<std::string> &Keys) {
  auto S = Db.prepare(SQL);
  if (!S)
    return S.takeError();
  StringSet<> Seen;
  std::vector<std::string> Out;
  for (const std::string &K : Keys) {
    S->bind(1, K);
    if (Error E = S->forEachRow([&](const SQLiteStatement &R) {
          if (Seen.insert(R.columnText(0)).second)
            Out.push_back(R.columnText(0).str());
        }))
      return E;
  }
  return Out;
}
} // namespace

Expected<std::vector<std::string>>
CodeIndex::includersOf(const std::vector<std::string> &RealPaths) {
  return collectPerKey(*Db,
                       "SELECT f.path FROM file_includes i JOIN files f ON f.id = i.file_id "
                       "WHERE i.included_path = ?1",
                       RealPaths);
}

Expected<StringMap<std::vector<std::string>>>
CodeIndex::includersOfEach(const std::vector<std::string> &RealPaths) {
  auto S = Db->prepare("SELECT f.path FROM file_includes i JOIN files f ON f.id = i.file_id "
                       "WHERE i.included_path = ?1");
  if (!S)
    return S.takeError();
  StringMap<std::vector<std::string>> Out;
  for (const std::string &P : RealPaths) {
    std::vector<std::string> &Mains = Out[P];
    S->bind(1, P);
    if (Error E = S->forEachRow(
            [&](const SQLiteStatement &R) { Mains.push_back(R.columnText(0).str()); }))
      return E;
  }
  return Out;
}

Expected<std::vector<std::string>>
CodeIndex::unitsMissing(const std::vector<std::string> &RealPaths) {
  return collectPerKey(*Db,
                       "SELECT f.path FROM include_misses m JOIN files f ON f.id = m.file_id "
                       "WHERE m.path = ?1",
                       RealPaths);
}

Expected<std::vector<std::string>>
CodeIndex::filesRecordedBy(const std::vector<std::string> &Mains) {
  return collectPerKey(*Db, "SELECT path FROM files WHERE recorded_by = ?1", Mains);
}

Error CodeIndex::updateFileTime(StringRef Path, int64_t MTimeNs) {
  auto S = Db->prepare("UPDATE files SET mtime_ns = ?2 WHERE path = ?1");
  if (!S)
    return S.takeError();
  return S->bind(1, Path).bind(2, MTimeNs).run();
}

Error CodeIndex::removeFile(StringRef Path) {
  Expected<int64_t> Id = fileId(Path);
  if (!Id)
    return Id.takeError();
  if (*Id < 0)
    return Error::success();
  if (Error E = deleteFileContents(*Id))
    return E;
  auto S = Db->prepare("DELETE FROM files WHERE id = ?1");
  if (!S)
    return S.takeError();
  return S->bind(1, *Id).run();
}

Error CodeIndex::rebuildSubclassLinks() {
  std::vector<ClassInfo> Classes;
  auto S = Db->prepare(
      "SELECT d.id, d.file_id, d.name, d.qualified_name, f.module, d.language, "
      "d.bases FROM definitions d JOIN files f ON f.id = d.file_id "
      "WHERE d.kind IN ('class', 'struct', 'union')");
  if (!S)
    return S.takeError();
  if (Error E = S->forEachRow([&](const SQLiteStatement &R) {
        ClassInfo C;
        C.Id = R.columnInt(0);
        C.FileId = R.columnInt(1);
        C.Name = R.columnText(2).str();
        C.QualifiedName = R.columnText(3).str();
        C.Module = R.columnText(4).str();
        C.IsPython = R.columnText(5) == "python";
        C.Bases = fromJSONList(R.columnText(6));
        Classes.push_back(std::move(C));
      }))
    return E;
  ImportTable Imports;
  auto I = Db->prepare("SELECT file_id, alias, target FROM imports");
  if (!I)
    return I.takeError();
  if (Error E = I->forEachRow([&](const SQLiteStatement &R) {
        Imports[R.columnInt(0)][R.columnText(1)] = R.columnText(2).str();
      }))
    return E;
  StringMap<int64_t> ModuleFiles;
  auto M = Db->prepare("SELECT id, module FROM files WHERE module IS NOT NULL");
  if (!M)
    return M.takeError();
  if (Error E = M->forEachRow([&](const SQLiteStatement &R) {
        ModuleFiles[R.columnText(1)] = R.columnInt(0);
      }))
    return E;
  std::vector<SubclassLink> Links = resolveSubclasses(Classes, Imports, ModuleFiles);
  if (Error E = Db->exec("DELETE FROM subclass_links"))
    return E;
  auto Ins = Db->prepare(
      "INSERT INTO subclass_links(base_id, sub_id, base_text, how) VALUES(?1, ?2, ?3, ?4)");
  if (!Ins)
    return Ins.takeError();
  for (const SubclassLink &L : Links)
    if (Error E = Ins->bind(1, L.BaseId).bind(2, L.SubId).bind(3, L.BaseText)
                      .bind(4, L.How).run())
      return E;
  return Error::success();
}

Expected<std::vector<IndexedDefinition>>
CodeIndex::selectDefinitions(StringRef Where, ArrayRef<std::string> Params,
                             StringRef OrderBy) {
  std::string SQL = (Twine("SELECT ") + DefinitionColumns +
                     " FROM definitions d JOIN files f ON f.id = d.file_id WHERE " +
                     Where + " ORDER BY " + OrderBy)
                        .str();
  auto S = Db->prepare(SQL);
  if (!S)
    return S.takeError();
  for (size_t I = 0; I < Params.size(); ++I)
    S->bind(int(I + 1), Params[I]);
  std::vector<IndexedDefinition> Out;
  if (Error E = S->forEachRow([&](const SQLiteStatement &Row) {
        IndexedDefinition R;
        R.Id = Row.columnInt(0);
        Definition &D = R.Def;
        D.Name = Row.columnText(1).str();
        D.QualifiedName = Row.columnText(2).str();
        D.Kind = parseKind(Row.columnText(3));
        D.LineStart = unsigned(Row.columnInt(4));
        D.LineEnd = unsigned(Row.columnInt(5));
        D.ByteStart = uint64_t(Row.columnInt(6));
        D.ByteEnd = uint64_t(Row.columnInt(7));
        D.Bases = fromJSONList(Row.columnText(8));
        D.Methods = fromJSONList(Row.columnText(9));
        D.Decorators = fromJSONList(Row.columnText(10));
        D.IsAsync = Row.columnInt(11) != 0;
        D.IsTemplate = Row.columnInt(12) != 0;
        D.USR = Row.columnText(13).str();
        D.MangledName = Row.columnText(14).str();
        R.File = Row.columnText(15).str();
        R.Language = Row.columnText(16).str();
        D.FoundByLexer = Row.columnText(17) == "lexer";
        D.IsDeclaration = Row.columnInt(18) != 0;
        R.Source = Row.columnText(19).str();
        Out.push_back(std::move(R));
      }))
    return E;
  return Out;
}

Expected<std::vector<IndexedDefinition>>
CodeIndex::classDefinitions(StringRef Name) {
  std::string N = Name.str();
  std::string Where = "d.kind IN ('class', 'struct', 'union') AND "
                      "(d.name = ?1 OR d.qualified_name = ?1";
  // A partly qualified name (`llama.LlamaMLP`, `attention::Foo`) matches as
  // a suffix of the qualified name.
  std::vector<std::string> Params = {N};
  if (Name.contains('.') || Name.contains("::")) {
    Where += " OR d.qualified_name GLOB ?2 OR d.qualified_name GLOB ?3";
    std::string Literal = globLiteral(Name);
    Params.push_back("*." + Literal);
    Params.push_back("*::" + Literal);
  }
  Where += ")";
  return selectDefinitions(Where, Params);
}

Expected<std::vector<IndexedDefinition>> CodeIndex::subclasses(StringRef Name,
                                                              bool Transitive) {
  auto Bases = classDefinitions(Name);
  if (!Bases)
    return Bases.takeError();
  std::vector<IndexedDefinition> Out;
  DenseSet<int64_t> Seen;
  std::deque<std::pair<int64_t, std::string>> Queue;
  for (const IndexedDefinition &B : *Bases) {
    Seen.insert(B.Id);
    Queue.push_back({B.Id, B.Def.QualifiedName});
  }
  while (!Queue.empty()) {
    auto [BaseId, BaseName] = Queue.front();
    Queue.pop_front();
    auto Subs = selectDefinitions(
        "d.id IN (SELECT sub_id FROM subclass_links WHERE base_id = ?1)",
        {std::to_string(BaseId)});
    if (!Subs)
      return Subs.takeError();
    for (IndexedDefinition &Sub : *Subs) {
      if (!Seen.insert(Sub.Id).second)
        continue;
      Sub.Relation = BaseName;
      if (Transitive)
        Queue.push_back({Sub.Id, Sub.Def.QualifiedName});
      Out.push_back(std::move(Sub));
    }
  }
  return Out;
}

Expected<std::vector<IndexedDefinition>> CodeIndex::findKernel(StringRef Symbol) {
  // Each rule's matches, definitions only when there are any (a prototype
  // in a header is not where the kernel's code is).
  auto Tag = [](Expected<std::vector<IndexedDefinition>> R, StringRef How)
      -> Expected<std::vector<IndexedDefinition>> {
    if (!R)
      return R;
    if (llvm::any_of(*R, [](const IndexedDefinition &D) { return !D.Def.IsDeclaration; }))
      llvm::erase_if(*R, [](const IndexedDefinition &D) { return D.Def.IsDeclaration; });
    for (IndexedDefinition &D : *R)
      D.Relation = How.str();
    return R;
  };
  Symbol = Symbol.trim();
  if (isMangledName(Symbol)) {
    auto Exact = selectDefinitions("d.mangled_name = ?1", {Symbol.str()});
    if (!Exact || !Exact->empty())
      return Tag(std::move(Exact), "mangled-name");
  }
  std::string Qualified = kernelQualifiedName(Symbol);
  auto ByQualified = selectDefinitions(
      "d.kind = 'kernel' AND d.qualified_name = ?1", {Qualified});
  if (!ByQualified || !ByQualified->empty())
    return Tag(std::move(ByQualified), "qualified-name");
  StringRef Base = StringRef(Qualified).rsplit("::").second;
  if (Base.empty())
    Base = Qualified;
  auto ByName = selectDefinitions("d.kind = 'kernel' AND d.name = ?1", {Base.str()});
  if (!ByName || !ByName->empty())
    return Tag(std::move(ByName), "name");
  // Triton kernels are Python functions; CUPTI reports their plain name. A
  // qualified or mangled name is a C++ kernel that is not indexed, and a
  // Python function that is not jitted (a launcher of the same name) is not
  // a kernel.
  if (Base != Symbol)
    return std::vector<IndexedDefinition>();
  auto Triton = selectDefinitions(
      "d.kind = 'function' AND d.language = 'python' AND d.name = ?1", {Base.str()});
  if (Triton)
    llvm::erase_if(*Triton, [](const IndexedDefinition &D) {
      return !llvm::any_of(D.Def.Decorators, isTritonDecorator);
    });
  return Tag(std::move(Triton), "function-name");
}

/// Whether an op registered in namespace \p Recorded is the op a trace
/// names in \p Asked. A namespace written as a macro (vLLM's
/// TORCH_EXTENSION_NAME, which the build sets to `_C`) stands for any; one
/// pasted from a macro and a suffix (`TORCH_EXTENSION_NAME_cache_ops`, which
/// is `_C_cache_ops`) for any that ends with the suffix. A macro starts with
/// a capital: `_C`, as vLLM's Python and stable-ABI blocks write it, is the
/// namespace `_C` itself, and `_C_cache_ops` is not a macro `_C_` pasted.
static bool opNamespaceMatches(StringRef Recorded, StringRef Asked) {
  if (Recorded == Asked)
    return true;
  if (Recorded.empty() || !isUpper(Recorded.front()))
    return false;
  StringRef Macro =
      Recorded.take_while([](char C) { return isUpper(C) || isDigit(C) || C == '_'; });
  if (Macro.size() == Recorded.size())
    return true;
  if (!Macro.ends_with("_"))
    return false; // `MyLib`: a name, not a macro
  StringRef Suffix = Recorded.drop_front(Macro.rtrim('_').size());
  return Asked.size() > Suffix.size() && Asked.ends_with(Suffix);
}

Expected<std::vector<IndexedDefinition>> CodeIndex::findOp(StringRef Name) {
  Name = Name.trim();
  auto [Namespace, Base] =
      Name.contains("::") ? Name.rsplit("::") : std::pair(StringRef(), Name);
  auto Ops = selectDefinitions("d.kind = 'op' AND d.name = ?1", {Base.str()});
  if (!Ops)
    return Ops;
  llvm::erase_if(*Ops, [&](const IndexedDefinition &Op) {
    return !Namespace.empty() &&
           !opNamespaceMatches(StringRef(Op.Def.QualifiedName).rsplit("::").first, Namespace);
  });
  // The implementing functions, once each. First those a registration names
  // (the qualified name as written: `&rms_norm` is the global rms_norm),
  // then other C++ functions of that simple name (in the registration's file
  // first, then the least qualified), then Python ones: a wrapper that calls
  // torch.ops._C.rms_norm has the name but is not the implementation, and a
  // report names the first.
  struct Candidate {
    int Rank;
    bool OtherFile;
    size_t Depth;
    IndexedDefinition D;
  };
  std::vector<Candidate> Impls;
  std::set<std::string> Seen;
  DenseMap<int64_t, size_t> ImplAt; // a definition two registrations name: its best rank
  for (const IndexedDefinition &Op : *Ops)
    for (const std::string &Function : Op.Def.Bases) {
      StringRef Fn = StringRef(Function).ltrim("&").ltrim(":");
      if (!Seen.insert(Fn.str()).second)
        continue;
      StringRef Simple = Fn.contains("::") ? Fn.rsplit("::").second : Fn;
      auto Impl = selectDefinitions(
          "d.kind IN ('function', 'method') AND (d.qualified_name = ?1 OR d.name = ?2) "
          "AND d.is_declaration = 0",
          {Fn.str(), Simple.str()});
      if (!Impl)
        return Impl.takeError();
      for (IndexedDefinition &D : *Impl) {
        bool Python = D.Language == "python";
        int Rank = D.Def.QualifiedName == Fn ? 0 : Python ? 2 : 1;
        auto [It, New] = ImplAt.try_emplace(D.Id, Impls.size());
        if (!New) {
          Impls[It->second].Rank = std::min(Impls[It->second].Rank, Rank);
          continue;
        }
        size_t Depth = StringRef(D.Def.QualifiedName).count("::");
        D.Relation = "implements " + Op.Def.QualifiedName;
        Impls.push_back({Rank, D.File != Op.File, Depth, std::move(D)});
      }
    }
  llvm::stable_sort(Impls, [](const Candidate &A, const Candidate &B) {
    if (A.Rank != B.Rank)
      return A.Rank < B.Rank;
    if (A.Rank != 1)
      return false; // in the registrations' order, then by path
    return std::tie(A.OtherFile, A.Depth) < std::tie(B.OtherFile, B.Depth);
  });
  std::vector<IndexedDefinition> Out = std::move(*Ops);
  for (Candidate &C : Impls)
    Out.push_back(std::move(C.D));
  return Out;
}

Expected<std::vector<IndexedDefinition>> CodeIndex::search(StringRef Text,
                                                           unsigned Limit) {
  return selectDefinitions(
      "d.kind != 'namespace' AND (d.name LIKE ?1 ESCAPE '\\' OR "
      "d.qualified_name LIKE ?1 ESCAPE '\\')",
      {likePattern(Text), Text.str()},
      ("d.name = ?2 DESC, length(d.qualified_name), d.qualified_name, f.path "
       "LIMIT " + Twine(Limit)).str());
}

Expected<IndexCounts> CodeIndex::counts() {
  IndexCounts C;
  auto S = Db->prepare(
      "SELECT (SELECT count(*) FROM files WHERE status = 'indexed'), "
      "(SELECT count(*) FROM files WHERE status != 'indexed'), "
      "(SELECT count(*) FROM definitions), "
      "(SELECT count(*) FROM definitions WHERE kind IN ('class', 'struct', 'union')), "
      "(SELECT count(*) FROM definitions WHERE kind IN ('function', 'method')), "
      "(SELECT count(*) FROM definitions WHERE kind = 'kernel'), "
      "(SELECT count(*) FROM subclass_links)");
  if (!S)
    return S.takeError();
  Expected<bool> Row = S->step();
  if (!Row)
    return Row.takeError();
  C.Files = S->columnInt(0);
  C.Skipped = S->columnInt(1);
  C.Definitions = S->columnInt(2);
  C.Classes = S->columnInt(3);
  C.Functions = S->columnInt(4);
  C.Kernels = S->columnInt(5);
  C.SubclassLinks = S->columnInt(6);
  return C;
}

} // namespace ekka
