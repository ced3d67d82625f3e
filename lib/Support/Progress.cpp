//===- Progress.cpp -------------------------------------------------------===//
#include "ekka/Support/Progress.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

using namespace llvm;

namespace ekka {

std::string progressLine(StringRef Label, size_t Done, size_t Total, StringRef Unit,
                         double Seconds, unsigned Columns) {
  std::string Line;
  raw_string_ostream OS(Line);
  if (!Total) {
    OS << Label << " ...";
  } else {
    size_t D = std::min(Done, Total);
    constexpr unsigned Width = 16;
    unsigned Filled = unsigned(Width * D / Total);
    OS << format("%-24s", Label.str().c_str()) << " ["
       << std::string(Filled, '#') << std::string(Width - Filled, '.') << "] " << D << "/"
       << Total;
    if (!Unit.empty())
      OS << " " << Unit;
    // A rate over less than a second says little.
    if (Seconds >= 1.0) {
      double Rate = double(D) / Seconds;
      OS << "  " << format(Rate >= 10 ? "%.0f" : "%.1f", Rate);
      if (!Unit.empty())
        OS << " " << Unit;
      OS << "/s  " << format("%.0fs", Seconds);
    }
  }
  if (Columns > 1 && Line.size() >= Columns)
    Line.resize(Columns - 1);
  return Line;
}

namespace {
std::atomic<bool> Disabled{false};
} // namespace

void ProgressBar::disable() { Disabled = true; }

bool ProgressBar::enabled() {
  if (Disabled)
    return false;
  if (const char *Env = std::getenv("EKKA_PROGRESS"))
    return StringRef(Env) == "1";
  return sys::Process::StandardErrIsDisplayed();
}

ProgressBar::ProgressBar(StringRef Label, size_t Total, StringRef Unit)
    : Label(Label.str()), Unit(Unit.str()), Total(Total), Active(enabled()),
      Start(std::chrono::steady_clock::now()) {
  if (Active)
    draw(true);
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::restart(StringRef NewLabel, size_t NewTotal, StringRef NewUnit) {
  {
    std::lock_guard<std::mutex> Lock(DrawMutex);
    Label = NewLabel.str();
    Unit = NewUnit.str();
    Total = NewTotal;
    Done = 0;
    Start = std::chrono::steady_clock::now();
  }
  if (Active)
    draw(true);
}

void ProgressBar::advance(size_t N) {
  Done += N;
  if (Active)
    draw(false);
}

void ProgressBar::draw(bool Force) {
  auto Now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> Lock(DrawMutex, std::defer_lock);
  if (Force)
    Lock.lock();
  else if (!Lock.try_lock())
    return;
  if (!Force && Now - LastDraw < std::chrono::milliseconds(100))
    return;
  LastDraw = Now;
  unsigned Columns = sys::Process::StandardErrColumns();
  std::string Line = progressLine(Label, Done, Total, Unit,
                                  std::chrono::duration<double>(Now - Start).count(),
                                  Columns ? Columns : 80);
  // Erase the line's end: the last line drawn may have been longer.
  errs() << "\r" << Line << "\x1b[K";
  errs().flush();
}

void ProgressBar::finish() {
  if (!Active)
    return;
  draw(true);
  Active = false;
  std::lock_guard<std::mutex> Lock(DrawMutex);
  errs() << "\r\x1b[2K";
  errs().flush();
}

} // namespace ekka
