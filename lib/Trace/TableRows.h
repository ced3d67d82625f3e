//===- TableRows.h - Rows inserted many to a statement ----------*- C++ -*-===//
//
// The writer's thread inserts each table's rows in statements of up to 32
// rows (TraceWriterStorage.cpp). Private to lib/Trace.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_LIB_TRACE_TABLEROWS_H
#define EKKA_LIB_TRACE_TABLEROWS_H

#include "ekka/Support/Error.h"
#include "ekka/Support/SQLite.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/Twine.h"

#include <charconv>
#include <optional>
#include <string>
#include <vector>

namespace ekka {
namespace trace_writer {

using llvm::ArrayRef;
using llvm::Error;
using llvm::StringRef;
using llvm::Twine;


/// `[1,4,32]`, as llvm::json writes an array of integers, into \p Out
/// without building one (twice for every tensor row the writer inserts;
/// \p Out keeps its capacity from row to row).
inline void jsonInts(ArrayRef<int64_t> V, std::string &Out) {
  Out.assign(1, '[');
  char Digits[24];
  for (size_t I = 0; I < V.size(); ++I) {
    if (I)
      Out += ',';
    auto [End, Ec] = std::to_chars(Digits, Digits + sizeof(Digits), V[I]);
    (void)Ec; // 24 characters hold any int64
    Out.append(Digits, End);
  }
  Out += ']';
}

inline void dim3(const uint32_t D[3], std::string &Out) {
  jsonInts({int64_t(D[0]), int64_t(D[1]), int64_t(D[2])}, Out);
}

/// One table's rows, inserted up to MaxRows by one statement. What SQLite
/// does once a statement (starting its program, opening the table, halting,
/// growing the record's buffer again) is about a fifth of a row's cost when
/// each row has its own; many rows share it. A row's values wait here until
/// flush(), which the writer calls before it commits: a text is referenced,
/// and must stay valid until then (the writer's interned names, the batch's
/// records), unless it is the row's own (own()).
class TableRows {
public:
  static constexpr unsigned MaxRows = 32;
  /// In row(): the column's own text, filled through own() before.
  struct Owned {};

  explicit TableRows(unsigned Width)
      : Width(Width), Cells(MaxRows * Width), OwnTexts(MaxRows * Width) {}

  /// Prepares its statements: \p Insert is `INSERT INTO t(a, b, ...)`,
  /// naming Width columns.
  Error prepare(SQLiteDatabase &Db, StringRef Insert) {
    std::string Row = "(?";
    for (unsigned I = 1; I < Width; ++I)
      Row += ",?";
    Row += ')';
    for (unsigned Log = 0; (1u << Log) <= MaxRows; ++Log) {
      std::string SQL = Insert.str() + " VALUES" + Row;
      for (unsigned R = 1; R < (1u << Log); ++R)
        SQL += "," + Row;
      auto S = Db.prepare(SQL);
      if (!S)
        return S.takeError();
      Statements[Log] = std::move(*S);
      Bound[Log].assign((1u << Log) * Width, Cell::unbound());
    }
    return Error::success();
  }

  /// The values of the row being filled, by column (1-based, as SQLite's
  /// parameters).
  void set(unsigned Column, int64_t V) { cell(Column) = Cell::integer(V); }
  void set(unsigned Column, std::optional<int64_t> V) {
    cell(Column) = V ? Cell::integer(*V) : Cell();
  }
  void setReal(unsigned Column, double V) {
    Cell &C = cell(Column);
    C.Kind = Cell::Real;
    C.AsReal = V;
  }
  void setNull(unsigned Column) { cell(Column) = Cell(); }
  /// \p Text, valid until flush().
  void setText(unsigned Column, StringRef Text) { cell(Column) = Cell::text(Text); }
  /// The row's own text for \p Column, to fill; it keeps its capacity.
  std::string &own(unsigned Column) {
    std::string &T = OwnTexts[Rows * Width + Column - 1];
    Cell &C = cell(Column);
    C.Kind = Cell::OwnText;
    C.AsOwn = &T;
    return T;
  }

  /// A row of these values, by column in order: numbers, NULL where an
  /// optional has none, texts (valid until flush()), and Owned{} for a
  /// column whose own text own() gave.
  template <typename... Values> Error row(const Values &...V) {
    static_assert(sizeof...(Values) > 0);
    if (sizeof...(Values) != Width) // else an earlier row's cells would stay
      return makeError("internal error: a row of " + Twine(sizeof...(Values)) +
                       " values for a table of " + Twine(Width) + " columns");
    unsigned Column = 0;
    (put(++Column, V), ...);
    return add();
  }

  /// The row is filled: the next is another. Inserts them all once
  /// MaxRows wait.
  Error add() {
    if (++Rows < MaxRows)
      return Error::success();
    return flush();
  }

  /// Inserts the rows that wait, in statements of 32, 16, ... 1 rows. They
  /// are gone afterwards, inserted or not. A parameter is bound only where
  /// it does not hold the value already: SQLite keeps a statement's
  /// bindings from one run to the next, and a binding costs about as much
  /// as a column's share of the insert. A text is bound without a copy
  /// (SQLite reads its bytes when the statement runs), so one at the
  /// address and of the length that a parameter holds is bound already.
  Error flush() {
    unsigned Done = 0;
    for (int Log = std::size(Statements) - 1; Log >= 0 && Done < Rows; --Log) {
      unsigned Size = 1u << Log;
      if (Rows - Done < Size)
        continue;
      SQLiteStatement &S = Statements[Log];
      std::vector<Cell> &Holds = Bound[Log];
      for (unsigned I = 0; I < Size * Width; ++I) {
        Cell C = Cells[Done * Width + I];
        if (C.Kind == Cell::OwnText)
          C = Cell::text(*C.AsOwn);
        if (C.sameAs(Holds[I]))
          continue;
        Holds[I] = C;
        int Parameter = int(I + 1);
        switch (C.Kind) {
        case Cell::Unbound:
        case Cell::OwnText:
          break;
        case Cell::Null:
          S.bindNull(Parameter);
          break;
        case Cell::Integer:
          S.bind(Parameter, C.AsInteger);
          break;
        case Cell::Real:
          S.bindDouble(Parameter, C.AsReal);
          break;
        case Cell::Text:
          S.bindKept(Parameter, StringRef(C.AsText, C.Size));
          break;
        }
      }
      if (Error E = S.runRebound()) {
        Rows = 0;
        return E;
      }
      Done += Size;
    }
    Rows = 0;
    return Error::success();
  }

  /// Drops the rows that wait.
  void clear() { Rows = 0; }

private:
  void put(unsigned Column, int64_t V) { set(Column, V); }
  void put(unsigned Column, const std::optional<int64_t> &V) { set(Column, V); }
  void put(unsigned Column, StringRef V) { setText(Column, V); }
  void put(unsigned, Owned) {}

  struct Cell {
    enum Kind : uint8_t { Null, Integer, Real, Text, OwnText, Unbound };
    Kind Kind = Null;
    size_t Size = 0; ///< Text's.
    union {
      int64_t AsInteger = 0;
      double AsReal;
      const char *AsText;
      const std::string *AsOwn;
    };
    static Cell integer(int64_t V) {
      Cell C;
      C.Kind = Cell::Integer;
      C.AsInteger = V;
      return C;
    }
    static Cell text(StringRef Text) {
      Cell C;
      C.Kind = Cell::Text;
      C.AsText = Text.data();
      C.Size = Text.size();
      return C;
    }
    static Cell unbound() {
      Cell C;
      C.Kind = Unbound;
      return C;
    }
    /// Whether binding this where \p Bound was bound leaves the parameter
    /// as it is (never where nothing was bound).
    bool sameAs(const Cell &Bound) const {
      if (Kind != Bound.Kind)
        return false;
      switch (Kind) {
      case Null:
        return true;
      case Integer:
        return AsInteger == Bound.AsInteger;
      case Real: // bit for bit: 0.0 is not -0.0 (a NaN is never bound)
        return std::memcmp(&AsReal, &Bound.AsReal, sizeof AsReal) == 0;
      case Text:
        return AsText == Bound.AsText && Size == Bound.Size;
      default:
        return false;
      }
    }
  };
  Cell &cell(unsigned Column) { return Cells[Rows * Width + Column - 1]; }

  const unsigned Width;
  std::vector<Cell> Cells;         ///< MaxRows rows of Width.
  std::vector<std::string> OwnTexts; ///< The cells' own texts, where they have one.
  unsigned Rows = 0;               ///< Filled so far.
  SQLiteStatement Statements[6];   ///< Of 1, 2, 4, ..., MaxRows rows.
  std::vector<Cell> Bound[6];      ///< What each one's parameters hold.
};
static_assert(TableRows::MaxRows == 1u << 5, "a statement for each power of two up to it");

} // namespace trace_writer
} // namespace ekka

#endif
