//===- SQLite.cpp ---------------------------------------------------------===//
#include "ekka/Support/SQLite.h"
#include "ekka/Support/Error.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Errno.h"
#include "llvm/Support/FileSystem.h"

#include <sqlite3.h>

using namespace llvm;

namespace ekka {

SQLiteStatement::SQLiteStatement(SQLiteStatement &&Other) noexcept
    : Stmt(Other.Stmt), Db(Other.Db) {
  Other.Stmt = nullptr;
}

SQLiteStatement &SQLiteStatement::operator=(SQLiteStatement &&Other) noexcept {
  if (this != &Other) {
    sqlite3_finalize(Stmt);
    Stmt = Other.Stmt;
    Db = Other.Db;
    Other.Stmt = nullptr;
  }
  return *this;
}

SQLiteStatement::~SQLiteStatement() { sqlite3_finalize(Stmt); }

SQLiteStatement &SQLiteStatement::bind(int Index, int64_t Value) {
  sqlite3_bind_int64(Stmt, Index, Value);
  return *this;
}

SQLiteStatement &SQLiteStatement::bind(int Index, StringRef Text) {
  sqlite3_bind_text(Stmt, Index, Text.data(), int(Text.size()), SQLITE_TRANSIENT);
  return *this;
}

SQLiteStatement &SQLiteStatement::bindKept(int Index, StringRef Text) {
  sqlite3_bind_text(Stmt, Index, Text.data(), int(Text.size()), SQLITE_STATIC);
  return *this;
}

SQLiteStatement &SQLiteStatement::bindDouble(int Index, double Value) {
  sqlite3_bind_double(Stmt, Index, Value);
  return *this;
}

SQLiteStatement &SQLiteStatement::bindBlob(int Index, StringRef Bytes) {
  sqlite3_bind_blob(Stmt, Index, Bytes.data(), int(Bytes.size()), SQLITE_TRANSIENT);
  return *this;
}

SQLiteStatement &SQLiteStatement::bindNull(int Index) {
  sqlite3_bind_null(Stmt, Index);
  return *this;
}

SQLiteStatement &SQLiteStatement::bind(int Index, const std::optional<int64_t> &Value) {
  return Value ? bind(Index, *Value) : bindNull(Index);
}

Expected<bool> SQLiteStatement::step() {
  int RC = sqlite3_step(Stmt);
  if (RC == SQLITE_ROW)
    return true;
  if (RC == SQLITE_DONE)
    return false;
  return Db->lastError("query failed");
}

Error SQLiteStatement::run() {
  return forEachRow([](const SQLiteStatement &) {});
}

Error SQLiteStatement::runRebound() {
  Error E = stepAll([](const SQLiteStatement &) {});
  sqlite3_reset(Stmt);
  return E;
}

Error SQLiteStatement::forEachRow(function_ref<void(const SQLiteStatement &)> OnRow) {
  Error E = stepAll(OnRow);
  reset();
  return E;
}

Error SQLiteStatement::stepAll(function_ref<void(const SQLiteStatement &)> OnRow) {
  while (true) {
    Expected<bool> Row = step();
    if (!Row)
      return Row.takeError();
    if (!*Row)
      return Error::success();
    OnRow(*this);
  }
}

void SQLiteStatement::reset() {
  sqlite3_reset(Stmt);
  sqlite3_clear_bindings(Stmt);
}

int64_t SQLiteStatement::columnInt(int Index) const {
  return sqlite3_column_int64(Stmt, Index);
}

double SQLiteStatement::columnDouble(int Index) const {
  return sqlite3_column_double(Stmt, Index);
}

StringRef SQLiteStatement::columnText(int Index) const {
  const char *P = static_cast<const char *>(sqlite3_column_blob(Stmt, Index));
  int N = sqlite3_column_bytes(Stmt, Index);
  return P ? StringRef(P, size_t(N)) : StringRef();
}

bool SQLiteStatement::columnIsNull(int Index) const {
  return sqlite3_column_type(Stmt, Index) == SQLITE_NULL;
}

Expected<std::unique_ptr<SQLiteDatabase>> SQLiteDatabase::open(StringRef Path,
                                                               Mode M) {
  if (M == Mode::ReadOnly) {
    if (!sys::fs::exists(Path))
      return makeError("'" + Path + "': no such file");
    if (sys::fs::is_directory(Path))
      return makeError("'" + Path + "' is a directory, not a database file");
  }
  // No memory statistics: keeping them takes a process-wide mutex at every
  // allocation, a tenth of a trace writer's time. Only before SQLite's
  // initialisation; where the program initialised it first (Python's
  // sqlite3 module), this is refused, and nothing changes. Otherwise it
  // holds for the program's own use of the same libsqlite3 too:
  // sqlite3_memory_used() then reads 0, and a soft heap limit is not
  // enforced (nothing Python's sqlite3 module uses).
  static const int NoMemoryStatistics = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
  (void)NoMemoryStatistics;
  int Flags = M == Mode::ReadWriteCreate ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
                                         : SQLITE_OPEN_READONLY;
  Flags |= SQLITE_OPEN_NOMUTEX;
  std::string Name = Path.str();
  if (M == Mode::Immutable) {
    // A URI: the characters a URI gives meaning to are escaped.
    // An absolute path after an empty authority: `//x` is no host.
    Name = Path.starts_with("/") ? "file://" : "file:";
    for (char C : Path) {
      if (C == '%' || C == '?' || C == '#' || static_cast<unsigned char>(C) < 0x21)
        Name.append(1, '%').append(llvm::utohexstr(static_cast<unsigned char>(C), false, 2));
      else
        Name += C;
    }
    Name += "?immutable=1";
    Flags |= SQLITE_OPEN_URI;
  }
  sqlite3 *Handle = nullptr;
  int RC = sqlite3_open_v2(Name.c_str(), &Handle, Flags, nullptr);
  if (RC != SQLITE_OK) {
    std::string Msg = Handle ? sqlite3_errmsg(Handle) : sqlite3_errstr(RC);
    sqlite3_close(Handle);
    return makeError("cannot open '" + Path + "': " + Msg);
  }
  sqlite3_busy_timeout(Handle, 5000);
  return std::unique_ptr<SQLiteDatabase>(new SQLiteDatabase(Handle, Path.str()));
}

SQLiteDatabase::~SQLiteDatabase() { sqlite3_close(Handle); }

namespace {
/// What failed, where SQLite says only "disk I/O error" (a file size limit
/// met, an I/O error) or "unable to open database file": the operation, or
/// the system's error where it could not open. errno after a failed I/O
/// may have been changed by SQLite's own calls since, so it is not given.
std::string systemCause(sqlite3 *Handle) {
  switch (int Code = sqlite3_extended_errcode(Handle)) {
  case SQLITE_IOERR_WRITE:
    return " (a write failed)";
  case SQLITE_IOERR_READ:
  case SQLITE_IOERR_SHORT_READ:
    return " (a read failed)";
  case SQLITE_IOERR_FSYNC:
  case SQLITE_IOERR_DIR_FSYNC:
    return " (an fsync failed)";
  case SQLITE_IOERR_TRUNCATE:
    return " (a truncate failed)";
  default:
    if ((Code & 0xff) == SQLITE_CANTOPEN)
      if (int Errno = sqlite3_system_errno(Handle))
        return " (" + sys::StrError(Errno) + ")";
    return "";
  }
}
} // namespace

Error SQLiteDatabase::exec(StringRef SQL) {
  char *Msg = nullptr;
  int RC = sqlite3_exec(Handle, SQL.str().c_str(), nullptr, nullptr, &Msg);
  if (RC == SQLITE_OK)
    return Error::success();
  std::string Text = (Msg ? Msg : sqlite3_errstr(RC)) + systemCause(Handle);
  sqlite3_free(Msg);
  return makeError("'" + Path + "': " + Text);
}

Expected<SQLiteStatement> SQLiteDatabase::prepare(StringRef SQL) {
  sqlite3_stmt *S = nullptr;
  if (sqlite3_prepare_v2(Handle, SQL.data(), int(SQL.size()), &S, nullptr) !=
      SQLITE_OK)
    return lastError("cannot prepare query");
  return SQLiteStatement(S, this);
}

Error SQLiteDatabase::lastError(StringRef What) const {
  // A damaged file is said to be one, whatever query met the damage.
  int Code = sqlite3_errcode(Handle);
  if (Code == SQLITE_CORRUPT || Code == SQLITE_NOTADB)
    return makeError("'" + Path + "' is corrupt: " + sqlite3_errmsg(Handle));
  return makeError("'" + Path + "': " + What + ": " + sqlite3_errmsg(Handle) +
                   systemCause(Handle));
}

std::string SQLiteDatabase::lastMessage() const {
  return sqlite3_errmsg(Handle) + systemCause(Handle);
}

int64_t SQLiteDatabase::lastInsertId() const {
  return sqlite3_last_insert_rowid(Handle);
}

} // namespace ekka
