//===- SQLite.h - A thin, error-checked SQLite wrapper ---------*- C++ -*-===//
//
// Every Ekka artifact that users open themselves (code index, trace) is an
// SQLite file. This wrapper turns SQLite's result codes into llvm::Error
// values that name the database file, and owns handles with RAII.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_SQLITE_H
#define EKKA_SUPPORT_SQLITE_H

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

struct sqlite3;
struct sqlite3_stmt;

namespace ekka {

class SQLiteDatabase;

/// A prepared statement. Bind with 1-based indices, step, read columns with
/// 0-based indices.
class SQLiteStatement {
public:
  SQLiteStatement() = default;
  SQLiteStatement(SQLiteStatement &&Other) noexcept;
  SQLiteStatement &operator=(SQLiteStatement &&Other) noexcept;
  ~SQLiteStatement();

  SQLiteStatement &bind(int Index, int64_t Value);
  SQLiteStatement &bind(int Index, llvm::StringRef Text);
  /// Text that the caller keeps valid until run() or forEachRow() has
  /// returned: not copied (a writer's hot path binds several a row).
  SQLiteStatement &bindKept(int Index, llvm::StringRef Text);
  SQLiteStatement &bindDouble(int Index, double Value);
  SQLiteStatement &bindBlob(int Index, llvm::StringRef Bytes);
  SQLiteStatement &bindNull(int Index);
  /// The value, or NULL when there is none.
  SQLiteStatement &bind(int Index, const std::optional<int64_t> &Value);

  /// Advances; true while a row is available, false when done.
  llvm::Expected<bool> step();
  /// Runs to completion, ignoring rows, and resets for reuse.
  llvm::Error run();
  /// As run(), keeping the bindings: the next run binds again only the
  /// parameters that change (a writer's inserts), and pays nothing for
  /// clearing them. SQLite keeps them through the reset, a failed step and
  /// its own re-preparing after a schema change. A kept text stays
  /// referenced after the run, read again only by a run that leaves it
  /// bound: it must then hold that run's value. (Nothing may expand a
  /// statement's SQL with its bindings, sqlite3_expanded_sql or a trace
  /// callback, where a kept text may be gone.)
  llvm::Error runRebound();
  /// Runs to completion, calling \p OnRow with each row, and resets.
  llvm::Error forEachRow(llvm::function_ref<void(const SQLiteStatement &)> OnRow);
  void reset();

  int64_t columnInt(int Index) const;
  double columnDouble(int Index) const;
  llvm::StringRef columnText(int Index) const;
  bool columnIsNull(int Index) const;

private:
  friend class SQLiteDatabase;
  SQLiteStatement(sqlite3_stmt *S, const SQLiteDatabase *Db) : Stmt(S), Db(Db) {}
  /// Steps until done or an error, calling \p OnRow with each row; does
  /// not reset.
  llvm::Error stepAll(llvm::function_ref<void(const SQLiteStatement &)> OnRow);
  sqlite3_stmt *Stmt = nullptr;
  const SQLiteDatabase *Db = nullptr;
};

class SQLiteDatabase {
public:
  /// Immutable: read-only, and the file is taken as one nobody changes:
  /// no lock, and no -wal or -shm file is looked for or made (a WAL-mode
  /// database is read as its main file holds it).
  enum class Mode { ReadOnly, Immutable, ReadWriteCreate };

  /// Opens \p Path. ReadOnly and Immutable require the file to exist.
  static llvm::Expected<std::unique_ptr<SQLiteDatabase>> open(llvm::StringRef Path,
                                                               Mode M);
  ~SQLiteDatabase();

  llvm::Error exec(llvm::StringRef SQL);
  llvm::Expected<SQLiteStatement> prepare(llvm::StringRef SQL);

  /// An error naming this database and SQLite's message for the last call.
  llvm::Error lastError(llvm::StringRef What) const;
  /// SQLite's message for the last failed call.
  std::string lastMessage() const;
  llvm::StringRef path() const { return Path; }
  int64_t lastInsertId() const;

private:
  SQLiteDatabase(sqlite3 *Handle, std::string Path)
      : Handle(Handle), Path(std::move(Path)) {}
  sqlite3 *Handle;
  std::string Path;
};

} // namespace ekka

#endif
