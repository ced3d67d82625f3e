//===- Host.cpp - The machine a trace was recorded on ---------------------===//
#include "ekka/Support/Host.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/MemoryBuffer.h"

#include <thread>

using namespace llvm;

namespace ekka {

namespace {

/// The extensions that choose kernels, in the order they are said: x86's
/// (/proc/cpuinfo `flags`) then Arm's (`Features`).
constexpr StringRef Extensions[] = {
    "avx",         "avx2",        "fma",        "f16c",     "avx512f",  "avx512bw",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
    "asimd",       "asimdhp",     "sve",        "sve2",     "bf16",     "i8mm",
    "sme"};

/// The value of the first line of \p Text whose key is \p Key ("key\t: value").
StringRef field(StringRef Text, StringRef Key) {
  while (!Text.empty()) {
    auto [Line, Rest] = Text.split('\n');
    Text = Rest;
    auto [Name, Value] = Line.split(':');
    if (Name.trim() == Key && Line.contains(':'))
      return Value.trim();
  }
  return "";
}

} // namespace

std::string describeCpu(StringRef CpuInfo, unsigned CPUs) {
  StringRef Model = field(CpuInfo, "model name");
  std::string Out = Model.empty() ? "unknown CPU" : Model.str();
  Out += CPUs == 0 ? std::string("; an unknown number of CPUs;")
                   : "; " + std::to_string(CPUs) + (CPUs == 1 ? " CPU;" : " CPUs;");
  StringSet<> Has;
  SmallVector<StringRef, 64> Flags;
  for (StringRef Key : {"flags", "Features"}) {
    Flags.clear();
    field(CpuInfo, Key).split(Flags, ' ', -1, /*KeepEmpty=*/false);
    for (StringRef F : Flags)
      Has.insert(F);
  }
  bool Any = false;
  for (StringRef E : Extensions)
    if (Has.contains(E)) {
      Out += " " + E.str();
      Any = true;
    }
  if (!Any)
    Out += " no vector extensions known";
  return Out;
}

std::string describeHostCpu() {
  unsigned CPUs = std::thread::hardware_concurrency();
  auto Info = MemoryBuffer::getFileAsStream("/proc/cpuinfo");
  return describeCpu(Info ? (*Info)->getBuffer() : StringRef(), CPUs);
}

} // namespace ekka
