//===- SQLiteTest.cpp -----------------------------------------------------===//
#include "ekka/Support/SQLite.h"

#include "llvm/Support/FileSystem.h"

#include <gtest/gtest.h>

using namespace ekka;
using namespace llvm;

namespace {

TEST(SQLite, RoundTripsTextIntegersAndBlobs) {
  auto Db = SQLiteDatabase::open(":memory:", SQLiteDatabase::Mode::ReadWriteCreate);
  ASSERT_TRUE(bool(Db)) << toString(Db.takeError());
  ASSERT_FALSE(bool((*Db)->exec("CREATE TABLE t(a INTEGER, b TEXT, c BLOB)")));
  auto Ins = (*Db)->prepare("INSERT INTO t VALUES(?1, ?2, ?3)");
  ASSERT_TRUE(bool(Ins));
  ASSERT_FALSE(bool(Ins->bind(1, int64_t(42)).bind(2, "name").bindBlob(3, StringRef("a\0b", 3)).run()));
  auto Sel = (*Db)->prepare("SELECT a, b, c FROM t");
  ASSERT_TRUE(bool(Sel));
  Expected<bool> Row = Sel->step();
  ASSERT_TRUE(Row && *Row);
  EXPECT_EQ(Sel->columnInt(0), 42);
  EXPECT_EQ(Sel->columnText(1), "name");
  EXPECT_EQ(Sel->columnText(2), StringRef("a\0b", 3));
}

TEST(SQLite, ErrorsNameTheDatabase) {
  auto Db = SQLiteDatabase::open(":memory:", SQLiteDatabase::Mode::ReadWriteCreate);
  ASSERT_TRUE(bool(Db));
  auto S = (*Db)->prepare("SELECT * FROM missing_table");
  ASSERT_FALSE(bool(S));
  std::string Msg = toString(S.takeError());
  EXPECT_NE(Msg.find("':memory:'"), std::string::npos) << Msg;
  EXPECT_NE(Msg.find("no such table: missing_table"), std::string::npos) << Msg;
}

TEST(SQLite, ReadOnlyOpenRequiresTheFile) {
  auto Db = SQLiteDatabase::open("/nonexistent/x.db", SQLiteDatabase::Mode::ReadOnly);
  ASSERT_FALSE(bool(Db));
  EXPECT_EQ(toString(Db.takeError()), "'/nonexistent/x.db': no such file");
}

} // namespace
