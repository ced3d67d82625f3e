//===- Progress.h - A progress bar for long work on a terminal -*- C++ -*-===//
#ifndef EKKA_SUPPORT_PROGRESS_H
#define EKKA_SUPPORT_PROGRESS_H

#include "llvm/ADT/StringRef.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

namespace ekka {

/// A one-line progress bar on stderr, redrawn at most ten times a second.
/// It draws only when stderr is a terminal (or EKKA_PROGRESS=1), so logs and
/// lit output stay clean. advance() may be called from any thread.
class ProgressBar {
public:
  ProgressBar(llvm::StringRef Label, size_t Total);
  ~ProgressBar();

  void advance(size_t N = 1);
  /// Changes the label (a new phase) and the total, keeping the bar.
  void restart(llvm::StringRef Label, size_t Total);
  /// Erases the bar; later output starts on a clean line.
  void finish();

  /// Whether bars are drawn in this process.
  static bool enabled();

private:
  void draw(bool Force);

  std::string Label;
  std::atomic<size_t> Done{0};
  size_t Total;
  bool Active;
  std::mutex DrawMutex;
  std::chrono::steady_clock::time_point LastDraw;
  std::chrono::steady_clock::time_point Start;
};

} // namespace ekka

#endif
