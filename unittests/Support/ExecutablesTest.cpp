//===- ExecutablesTest.cpp ------------------------------------------------===//
#include "ekka/Support/Executables.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cstring>
#include <elf.h>
#include <gtest/gtest.h>

#include <map>

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

/// A minimal executable: its header, a loaded segment over the whole file,
/// a dynamic segment naming \p Needed, the string table, and, where given,
/// an interpreter segment naming \p Interpreter (its size \p InterpSize if
/// not 0, to reach past the file's end).
std::string syntheticElf(llvm::StringRef Needed, llvm::StringRef Interpreter = "",
                         uint64_t InterpSize = 0) {
  constexpr uint64_t Base = 0x400000;
  unsigned Segments = Interpreter.empty() ? 2 : 3;
  Elf64_Ehdr H = {};
  std::memcpy(H.e_ident, ELFMAG, SELFMAG);
  H.e_ident[EI_CLASS] = ELFCLASS64;
  H.e_ident[EI_DATA] = ELFDATA2LSB;
  H.e_phoff = sizeof(H);
  H.e_phentsize = sizeof(Elf64_Phdr);
  H.e_phnum = Segments;
  uint64_t DynOff = sizeof(H) + Segments * sizeof(Elf64_Phdr);
  uint64_t StrOff = DynOff + 3 * sizeof(Elf64_Dyn);
  std::string Strings = std::string(1, '\0') + Needed.str() + '\0';
  uint64_t InterpOff = StrOff + Strings.size();
  std::string Interp = Interpreter.empty() ? "" : Interpreter.str() + '\0';
  Elf64_Phdr Load = {}, Dynamic = {}, InterpSegment = {};
  Load.p_type = PT_LOAD;
  Load.p_vaddr = Base;
  Load.p_filesz = InterpOff + Interp.size();
  Dynamic.p_type = PT_DYNAMIC;
  Dynamic.p_offset = DynOff;
  Dynamic.p_filesz = 3 * sizeof(Elf64_Dyn);
  InterpSegment.p_type = PT_INTERP;
  InterpSegment.p_offset = InterpOff;
  InterpSegment.p_filesz = InterpSize ? InterpSize : Interp.size();
  Elf64_Dyn Dyn[3] = {};
  Dyn[0].d_tag = DT_NEEDED;
  Dyn[0].d_un.d_val = 1;
  Dyn[1].d_tag = DT_STRTAB;
  Dyn[1].d_un.d_ptr = Base + StrOff;
  Dyn[2].d_tag = DT_NULL;
  std::string Out(reinterpret_cast<const char *>(&H), sizeof(H));
  Out.append(reinterpret_cast<const char *>(&Load), sizeof(Load));
  Out.append(reinterpret_cast<const char *>(&Dynamic), sizeof(Dynamic));
  if (!Interp.empty())
    Out.append(reinterpret_cast<const char *>(&InterpSegment), sizeof(InterpSegment));
  Out.append(reinterpret_cast<const char *>(Dyn), sizeof(Dyn));
  return Out + Strings + Interp;
}

std::string writeTemporary(llvm::StringRef Bytes) {
  llvm::SmallString<128> Path;
  int FD;
  EXPECT_FALSE(llvm::sys::fs::createTemporaryFile("ekka-elf", "bin", FD, Path));
  llvm::raw_fd_ostream OS(FD, /*shouldClose=*/true);
  OS << Bytes;
  return std::string(Path);
}

TEST(Executables, ReadsTheDynamicSectionThroughTheLoadedSegment) {
  std::string Elf = syntheticElf("libtorch_cpu.so");
  std::string Path = writeTemporary(Elf);
  EXPECT_EQ(neededLibraries(Path), std::vector<std::string>{"libtorch_cpu.so"});
  EXPECT_TRUE(linksLibTorch(Path));
  llvm::sys::fs::remove(Path);
  // A name cut off by the file's end: what is there, no further.
  Path = writeTemporary(llvm::StringRef(Elf).drop_back(4));
  EXPECT_EQ(neededLibraries(Path), std::vector<std::string>{"libtorch_cpu"});
  llvm::sys::fs::remove(Path);
}

// An engine's executable needs its own library, which needs LibTorch; two
// libraries that need each other are followed once each.
TEST(Executables, LibTorchIsReachedThroughTheLibrariesNeeded) {
  std::map<std::string, std::string> Files = {
      {"program", writeTemporary(syntheticElf("libengine.so"))},
      {"libengine.so", writeTemporary(syntheticElf("libc10.so"))},
      {"looping", writeTemporary(syntheticElf("liba.so"))},
      {"liba.so", writeTemporary(syntheticElf("libb.so"))},
      {"libb.so", writeTemporary(syntheticElf("liba.so"))}};
  int Asked = 0;
  auto Resolve = [&](llvm::StringRef Needed) -> std::string {
    ++Asked;
    auto It = Files.find(Needed.str());
    return It == Files.end() ? "" : It->second;
  };
  EXPECT_FALSE(linksLibTorch(Files["program"]));
  EXPECT_TRUE(reachesLibTorch(Files["program"], Resolve));
  EXPECT_FALSE(reachesLibTorch(Files["looping"], Resolve));
  EXPECT_EQ(Asked, 3); // libengine.so; liba.so and libb.so once each
  // What cannot be resolved is not followed.
  EXPECT_FALSE(reachesLibTorch(Files["program"], [](llvm::StringRef) { return std::string(); }));
  for (const auto &[Name, Path] : Files)
    llvm::sys::fs::remove(Path);
}

// A dynamically linked executable names the loader that starts it (which
// ekka-trace asks to list its libraries); a static one, or a script, none.
TEST(Executables, TheProgramInterpreterIsNamed) {
  EXPECT_NE(llvm::StringRef(programInterpreter("/proc/self/exe")).rsplit('/').second.find("ld-"),
            llvm::StringRef::npos);
  std::map<std::string, std::string> Want = {
      {writeTemporary(syntheticElf("libc.so.6")), ""},
      {writeTemporary(syntheticElf("libc.musl-x86_64.so.1", "/lib/ld-musl-x86_64.so.1")),
       "/lib/ld-musl-x86_64.so.1"},
      {writeTemporary(syntheticElf("libc.so.6", "/lib64/ld-linux-x86-64.so.2")),
       "/lib64/ld-linux-x86-64.so.2"},
      // Reaching past the file's end: nothing read from beyond it.
      {writeTemporary(syntheticElf("libc.so.6", "/lib64/ld.so", 1 << 20)), ""},
      {writeTemporary("#!/bin/sh\necho hi\n"), ""}};
  for (const auto &[Path, Interpreter] : Want) {
    EXPECT_EQ(programInterpreter(Path), Interpreter) << Path;
    llvm::sys::fs::remove(Path);
  }
}

TEST(Executables, HostileHeadersNameNothing) {
  std::string Elf = syntheticElf("libc10.so");
  auto Patched = [&](auto Patch) {
    std::string Copy = Elf;
    Patch(Copy);
    std::string Path = writeTemporary(Copy);
    auto Needed = neededLibraries(Path);
    llvm::sys::fs::remove(Path);
    return Needed;
  };
  auto Header = [](std::string &E) { return reinterpret_cast<Elf64_Ehdr *>(E.data()); };
  auto Segment = [](std::string &E, int I) {
    return reinterpret_cast<Elf64_Phdr *>(E.data() + sizeof(Elf64_Ehdr)) + I;
  };
  // Program headers past the end, or too many of them.
  EXPECT_TRUE(Patched([&](std::string &E) { Header(E)->e_phoff = ~uint64_t(0) - 8; }).empty());
  EXPECT_TRUE(Patched([&](std::string &E) { Header(E)->e_phnum = 0xffff; }).empty());
  // The dynamic segment at the file's end, or reaching past it.
  EXPECT_TRUE(Patched([&](std::string &E) { Segment(E, 1)->p_offset = E.size(); }).empty());
  EXPECT_TRUE(Patched([&](std::string &E) { Segment(E, 1)->p_filesz = ~uint64_t(0); })
                  .size() <= 1);
  // A string table in no loaded segment.
  EXPECT_TRUE(Patched([&](std::string &E) { Segment(E, 0)->p_vaddr = 0x10000000; }).empty());
  // A name offset far outside the string table.
  EXPECT_TRUE(Patched([&](std::string &E) {
                auto *Dyn = reinterpret_cast<Elf64_Dyn *>(E.data() + Segment(E, 1)->p_offset);
                Dyn[0].d_un.d_val = ~uint64_t(0) - 2;
              }).empty());
  // A 32-bit class.
  EXPECT_TRUE(Patched([&](std::string &E) { Header(E)->e_ident[EI_CLASS] = ELFCLASS32; }).empty());
}

} // namespace
