//===- Progress.h - Progress of long work on a terminal ---------*- C++ -*-===//
//
// A one-line progress display on stderr for the tools' long work: indexing a
// large repository, reading and comparing a large trace. It is a display
// only: it never writes to stdout, never draws when stderr is not a terminal
// (logs, pipes and lit stay clean), and erases itself before the tool's own
// output continues.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_PROGRESS_H
#define EKKA_SUPPORT_PROGRESS_H

#include "llvm/ADT/StringRef.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

namespace ekka {

/// The line a progress display shows, \p Columns wide at most: a phase
/// (\p Total 0) is its label alone; a count shows a bar, done of total in
/// \p Unit and, after a moment, the rate per second and the time so far.
std::string progressLine(llvm::StringRef Label, size_t Done, size_t Total,
                         llvm::StringRef Unit, double Seconds, unsigned Columns = 80);

/// A progress line on stderr, redrawn at most ten times a second. It draws
/// only when stderr is a terminal (EKKA_PROGRESS=1 forces it, =0 stops it).
/// advance() may be called from any thread.
class ProgressBar {
public:
  /// \p Total 0 is a phase: work whose size is not known, shown by name.
  explicit ProgressBar(llvm::StringRef Label, size_t Total = 0, llvm::StringRef Unit = "");
  ~ProgressBar();

  void advance(size_t N = 1);
  /// Starts the next phase or count on the same line, drawn at once.
  void restart(llvm::StringRef Label, size_t Total = 0, llvm::StringRef Unit = "");
  /// Draws the last state, then erases the line: what the tool prints next
  /// starts on a clean one.
  void finish();

  /// Whether progress is drawn in this process.
  static bool enabled();
  /// Draws no progress from now on in this process: for a tool whose own
  /// output goes to the terminal as it comes (a log on stdout).
  static void disable();

private:
  void draw(bool Force);

  std::string Label, Unit;
  std::atomic<size_t> Done{0};
  size_t Total;
  std::atomic<bool> Active; ///< Read by advance() on any thread.
  std::mutex DrawMutex;
  std::chrono::steady_clock::time_point LastDraw;
  std::chrono::steady_clock::time_point Start;
};

} // namespace ekka

#endif
