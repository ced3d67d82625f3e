//===- PrintableTest.cpp --------------------------------------------------===//
#include "ekka/Support/Printable.h"

#include <gtest/gtest.h>

using namespace ekka;
using namespace llvm;

namespace {

TEST(Printable, OrdinaryTextIsUnchanged) {
  EXPECT_EQ(printable("model.layers.0.self_attn"), "model.layers.0.self_attn");
  EXPECT_EQ(printable("/src/flash attn/caf\xc3\xa9_\xe4\xb8\xad.py"),
            "/src/flash attn/caf\xc3\xa9_\xe4\xb8\xad.py");
  EXPECT_EQ(printable("emoji \xf0\x9f\x98\x80 and a\\b"), "emoji \xf0\x9f\x98\x80 and a\\b");
  EXPECT_EQ(printable(""), "");
}

TEST(Printable, ControlCharactersAreEscaped) {
  EXPECT_EQ(printable("a\x1b[31mred.py"), "a\\x1b[31mred.py");
  EXPECT_EQ(printable("new\nline\tand\rcr"), "new\\x0aline\\x09and\\x0dcr");
  EXPECT_EQ(printable(StringRef("nul\0bel\x07" "del\x7f", 12)), "nul\\x00bel\\x07del\\x7f");
  // C1 controls as UTF-8: U+009B is a control sequence's start on some
  // terminals; U+00A0 (no-break space) is not a control.
  EXPECT_EQ(printable("x\xc2\x9b" "2Jy\xc2\x80\xc2\xa0"), "x\\u009b2Jy\\u0080\xc2\xa0");
}

TEST(Printable, BytesOutsideWellFormedUTF8AreEscaped) {
  EXPECT_EQ(printable("caf\xe9.py"), "caf\\xe9.py");
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");
  // Overlong forms, a surrogate, a truncated character, a lone C1 byte.
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(printable("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(printable("ab\xe4\xb8"), "ab\\xe4\\xb8");
  EXPECT_EQ(printable("\x9b" "2J"), "\\x9b2J");
}

TEST(Printable, StreamKeepsTheLayoutAndEscapesTheRest) {
  std::string Out;
  raw_string_ostream Under(Out);
  {
    PrintableStream OS(Under);
    OS << "suspect 1: model.\x1b]0;pwned\x07layer\n\tsource: a.py:3\n";
  }
  EXPECT_EQ(Out, "suspect 1: model.\\x1b]0;pwned\\x07layer\n\tsource: a.py:3\n");
  // A CRLF line end is layout, split between writes or not; a carriage
  // return alone (which would hide what came before it on the line) is not.
  Out.clear();
  {
    PrintableStream OS(Under);
    OS << "class A:\r\n    pass\r";
    OS << "\nhidden\rshown\r";
  }
  EXPECT_EQ(Out, "class A:\r\n    pass\r\nhidden\\x0dshown\\x0d");
}

TEST(Printable, StreamJoinsACharacterSplitBetweenWrites) {
  std::string Out;
  raw_string_ostream Under(Out);
  PrintableStream OS(Under);
  OS << "caf\xc3";
  OS << "\xa9 \xe4";
  OS << "\xb8";
  OS << "\xad \xc2";
  OS << "\x9b";
  OS.finish();
  EXPECT_EQ(Out, "caf\xc3\xa9 \xe4\xb8\xad \\u009b");
  // What is unfinished at the end is escaped, not lost.
  OS << "end\xe4\xb8";
  OS.finish();
  EXPECT_EQ(Out, "caf\xc3\xa9 \xe4\xb8\xad \\u009bend\\xe4\\xb8");
  // A start that the next write shows was not a character's: written at
  // once, not held back until the stream is finished.
  OS << "\xe4";
  OS << "x\n";
  EXPECT_EQ(Out, "caf\xc3\xa9 \xe4\xb8\xad \\u009bend\\xe4\\xb8\\xe4x\n");
  // Nor is a byte that no character starts with (F5 to FF), or a lead
  // followed by what cannot continue it.
  OS << "\xf5";
  EXPECT_EQ(Out, "caf\xc3\xa9 \xe4\xb8\xad \\u009bend\\xe4\\xb8\\xe4x\n\\xf5");
  OS << "\xe4" "a\xe4\xb8";
  EXPECT_EQ(Out, "caf\xc3\xa9 \xe4\xb8\xad \\u009bend\\xe4\\xb8\\xe4x\n\\xf5\\xe4a");
  OS.finish();
  EXPECT_EQ(Out, "caf\xc3\xa9 \xe4\xb8\xad \\u009bend\\xe4\\xb8\\xe4x\n\\xf5\\xe4a\\xe4\\xb8");
}

} // namespace
