//===- Progress.cpp -------------------------------------------------------===//
#include "ekka/Support/Progress.h"

#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

using namespace llvm;

namespace ekka {

bool ProgressBar::enabled() {
  if (const char *Env = std::getenv("EKKA_PROGRESS"))
    return StringRef(Env) == "1";
  return sys::Process::StandardErrIsDisplayed();
}

ProgressBar::ProgressBar(StringRef Label, size_t Total)
    : Label(Label.str()), Total(Total), Active(enabled()),
      Start(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::restart(StringRef NewLabel, size_t NewTotal) {
  std::lock_guard<std::mutex> Lock(DrawMutex);
  Label = NewLabel.str();
  Total = NewTotal;
  Done = 0;
}

void ProgressBar::advance(size_t N) {
  Done += N;
  if (Active)
    draw(false);
}

void ProgressBar::draw(bool Force) {
  auto Now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> Lock(DrawMutex, std::try_to_lock);
  if (!Lock.owns_lock())
    return;
  if (!Force && Now - LastDraw < std::chrono::milliseconds(100))
    return;
  LastDraw = Now;
  size_t D = Done, T = Total ? Total : 1;
  if (D > T)
    D = T;
  constexpr unsigned Width = 30;
  unsigned Filled = unsigned(Width * D / T);
  double Secs = std::chrono::duration<double>(Now - Start).count();
  std::string Bar(Filled, '#');
  Bar.append(Width - Filled, '.');
  errs() << format("\r%-24s [%s] %zu/%zu  %.1fs", Label.c_str(), Bar.c_str(),
                   D, Total, Secs);
  errs().flush();
}

void ProgressBar::finish() {
  if (!Active)
    return;
  Active = false;
  std::lock_guard<std::mutex> Lock(DrawMutex);
  errs() << "\r\x1b[2K";
  errs().flush();
}

} // namespace ekka
