//===- Printable.cpp ------------------------------------------------------===//
#include "ekka/Support/Printable.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/ConvertUTF.h"

#include <cstdio>

using namespace llvm;

namespace ekka {

namespace {

/// Appends \p In to \p Out escaped, and returns how many bytes of it were
/// taken: all, unless \p Final is false and it ends inside a character
/// that may yet be finished by what follows.
size_t appendEscaped(std::string &Out, StringRef In, bool KeepLayout, bool Final) {
  auto Escape = [&](const char *Form, unsigned Byte) {
    char Buf[8];
    snprintf(Buf, sizeof Buf, Form, Byte);
    Out += Buf;
  };
  size_t I = 0;
  while (I < In.size()) {
    auto B = static_cast<unsigned char>(In[I]);
    if (B < 0x80) {
      // A report's layout: newlines, tabs, and a carriage return that ends
      // a line (a source excerpt of a file with CRLF line ends).
      if (KeepLayout && B == '\r' && I + 1 == In.size() && !Final)
        return I;
      bool Layout = KeepLayout && (B == '\n' || B == '\t' ||
                                   (B == '\r' && I + 1 < In.size() && In[I + 1] == '\n'));
      if ((B < 0x20 && !Layout) || B == 0x7f)
        Escape("\\x%02x", B);
      else
        Out += char(B);
      ++I;
      continue;
    }
    unsigned Length = getNumBytesForUTF8(B);
    const auto *P = reinterpret_cast<const UTF8 *>(In.data() + I);
    // What may be the start of a character whose rest comes with the next
    // write: a lead byte that can start one, and continuation bytes only.
    if (!Final && B >= 0xc2 && B <= 0xf4 && I + Length > In.size() &&
        llvm::all_of(In.drop_front(I + 1),
                     [](char C) { return (static_cast<unsigned char>(C) & 0xc0) == 0x80; }))
      return I;
    if (Length < 2 || Length > 4 || I + Length > In.size() ||
        !isLegalUTF8Sequence(P, P + Length)) {
      Escape("\\x%02x", B);
      ++I;
      continue;
    }
    // U+0080 to U+009F: C1 controls, which some terminals act on (U+009B
    // opens a control sequence as ESC [ does).
    if (Length == 2 && B == 0xc2 && P[1] < 0xa0)
      Escape("\\u%04x", P[1]);
    else
      Out.append(In.data() + I, Length);
    I += Length;
  }
  return I;
}

} // namespace

std::string printable(StringRef S) {
  std::string Out;
  Out.reserve(S.size());
  appendEscaped(Out, S, /*KeepLayout=*/false, /*Final=*/true);
  return Out;
}

PrintableStream::PrintableStream(raw_ostream &Out) : Out(Out) {
  // Unbuffered: every write goes through write_impl at once, into the
  // buffer of the stream underneath.
  SetUnbuffered();
}

PrintableStream::~PrintableStream() { finish(); }

void PrintableStream::finish() {
  flush();
  if (!Pending.empty()) {
    std::string Escaped;
    appendEscaped(Escaped, Pending, /*KeepLayout=*/true, /*Final=*/true);
    Pending.clear();
    Out << Escaped;
  }
  Out.flush();
}

void PrintableStream::write_impl(const char *Ptr, size_t Size) {
  Written += Size;
  std::string In = std::move(Pending);
  In.append(Ptr, Size);
  std::string Escaped;
  size_t Taken = appendEscaped(Escaped, In, /*KeepLayout=*/true, /*Final=*/false);
  Pending = In.substr(Taken);
  Out << Escaped;
}

} // namespace ekka
