//===- Printable.h - Text from others, safe to print ------------*- C++ -*-===//
//
// Names and paths that come from someone else's files (a repository's file
// names, a trace's module names) end up in the tools' text output. A name
// holding ESC or another control character would act on the user's
// terminal when printed as it is (clear the screen, retitle the window,
// hide the lines before it), and a newline in one would break the
// one-line-per-result layout that scripts read. These escape them: a
// control character (C0, DEL, or C1 encoded as UTF-8) becomes \xNN or
// \u00NN, and a byte that is not part of well-formed UTF-8 becomes \xNN.
// Everything else, backslashes included, is printed as it is. JSON output
// is left to its writer, which escapes C0 controls (DEL and C1 pass as the
// names hold them): it is for programs to read.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_PRINTABLE_H
#define EKKA_SUPPORT_PRINTABLE_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace ekka {

/// \p S with every control character (newline and tab too) and every byte
/// outside well-formed UTF-8 escaped: one name or path, fit for one line.
std::string printable(llvm::StringRef S);

/// A stream that passes text on to another with the same escapes, except
/// that newlines, tabs and the carriage return of a CRLF pass as they are:
/// a whole report, whose layout is its own (its names go through
/// printable() as well, each kept to its line). A multi-byte character
/// split between two writes is joined; what is left unfinished at the end
/// is escaped by finish() or the destructor.
class PrintableStream : public llvm::raw_ostream {
public:
  explicit PrintableStream(llvm::raw_ostream &Out);
  ~PrintableStream() override;

  /// Writes what is held back (an unfinished character, escaped) and
  /// flushes the stream underneath.
  void finish();

private:
  void write_impl(const char *Ptr, size_t Size) override;
  uint64_t current_pos() const override { return Written; }

  llvm::raw_ostream &Out;
  std::string Pending;
  uint64_t Written = 0;
};

} // namespace ekka

#endif // EKKA_SUPPORT_PRINTABLE_H
