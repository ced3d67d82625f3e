//===- ExecutablesTest.cpp ------------------------------------------------===//
#include "ekka/Support/Executables.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <gtest/gtest.h>

using namespace ekka;

namespace {

// This test's own executable: an ELF that names libc, and no LibTorch.
TEST(Executables, NamesTheLibrariesAnExecutableNeeds) {
  auto Needed = neededLibraries("/proc/self/exe");
  EXPECT_TRUE(std::any_of(Needed.begin(), Needed.end(),
                          [](const std::string &L) { return L.rfind("libc.so", 0) == 0; }));
  EXPECT_FALSE(linksLibTorch("/proc/self/exe"));
}

// A script and a missing file name no libraries; truncations of a real
// executable are read without a crash.
TEST(Executables, AnythingElseNamesNone) {
  llvm::SmallString<128> Script;
  int FD;
  ASSERT_FALSE(llvm::sys::fs::createTemporaryFile("ekka-script", "sh", FD, Script));
  {
    llvm::raw_fd_ostream OS(FD, /*shouldClose=*/true);
    OS << "#!/bin/sh\necho libtorch_cpu.so\n";
  }
  EXPECT_TRUE(neededLibraries(Script).empty());
  EXPECT_TRUE(neededLibraries("/nonexistent/program").empty());
  auto Self = llvm::MemoryBuffer::getFile("/proc/self/exe", false, false);
  ASSERT_TRUE(bool(Self));
  llvm::StringRef Bytes = (*Self)->getBuffer();
  for (size_t Cut : {size_t(0), size_t(16), size_t(64), size_t(200), size_t(4096),
                     Bytes.size() / 3, Bytes.size() / 2}) {
    llvm::SmallString<128> Part;
    ASSERT_FALSE(llvm::sys::fs::createTemporaryFile("ekka-cut", "bin", FD, Part));
    {
      llvm::raw_fd_ostream OS(FD, /*shouldClose=*/true);
      OS << Bytes.take_front(Cut);
    }
    neededLibraries(Part); // whatever it finds, within the bytes there are
    llvm::sys::fs::remove(Part);
  }
  llvm::sys::fs::remove(Script);
}

} // namespace
