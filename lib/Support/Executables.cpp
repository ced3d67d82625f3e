//===- Executables.cpp - What an executable links -------------------------===//
#include "ekka/Support/Executables.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cstring>
#include <elf.h>
#include <optional>
#include <set>

using namespace llvm;

namespace ekka {

namespace {

/// What the loader reads of a 64-bit little-endian ELF file: the libraries
/// it names (DT_NEEDED) and its program interpreter (PT_INTERP).
struct DynamicInfo {
  std::vector<std::string> Needed;
  std::string Interpreter;
};

DynamicInfo readDynamicInfo(StringRef Path) {
  auto File = MemoryBuffer::getFile(Path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!File)
    return {};
  StringRef Bytes = (*File)->getBuffer();
  // \p Size bytes at \p Base + \p Delta, all inside the file (a sum that
  // wraps around is outside too); else null.
  auto At = [&](uint64_t Base, uint64_t Delta, uint64_t Size) -> const char * {
    uint64_t Offset = Base + Delta;
    if (Offset < Base || Offset > Bytes.size() || Size > Bytes.size() - Offset)
      return nullptr;
    return Bytes.data() + Offset;
  };
  Elf64_Ehdr H;
  if (!At(0, 0, sizeof(H)))
    return {};
  std::memcpy(&H, Bytes.data(), sizeof(H));
  if (std::memcmp(H.e_ident, ELFMAG, SELFMAG) != 0 || H.e_ident[EI_CLASS] != ELFCLASS64 ||
      H.e_ident[EI_DATA] != ELFDATA2LSB || H.e_phentsize != sizeof(Elf64_Phdr))
    return {};
  std::vector<Elf64_Phdr> Segments;
  for (unsigned I = 0; I < H.e_phnum; ++I) {
    Elf64_Phdr P;
    const char *Src = At(H.e_phoff, uint64_t(I) * sizeof(P), sizeof(P));
    if (!Src)
      return {};
    std::memcpy(&P, Src, sizeof(P));
    Segments.push_back(P);
  }
  // The dynamic section's string table is given as an address: the file
  // offset is that of the loaded segment holding it.
  auto FileOffset = [&](uint64_t Address) -> std::optional<uint64_t> {
    for (const Elf64_Phdr &P : Segments)
      if (P.p_type == PT_LOAD && Address >= P.p_vaddr && Address - P.p_vaddr < P.p_filesz &&
          At(P.p_offset, Address - P.p_vaddr, 0))
        return P.p_offset + (Address - P.p_vaddr);
    return std::nullopt;
  };
  DynamicInfo Info;
  std::vector<std::string> &Needed = Info.Needed;
  for (const Elf64_Phdr &P : Segments) {
    if (P.p_type == PT_INTERP) {
      if (const char *S = At(P.p_offset, 0, P.p_filesz))
        Info.Interpreter.assign(S, strnlen(S, size_t(P.p_filesz)));
      continue;
    }
    if (P.p_type != PT_DYNAMIC)
      continue;
    std::vector<uint64_t> Names;
    std::optional<uint64_t> Strings;
    for (uint64_t Off = 0; Off + sizeof(Elf64_Dyn) <= P.p_filesz; Off += sizeof(Elf64_Dyn)) {
      Elf64_Dyn D;
      const char *Src = At(P.p_offset, Off, sizeof(D));
      if (!Src)
        break;
      std::memcpy(&D, Src, sizeof(D));
      if (D.d_tag == DT_NULL)
        break;
      if (D.d_tag == DT_NEEDED)
        Names.push_back(D.d_un.d_val);
      else if (D.d_tag == DT_STRTAB)
        Strings = FileOffset(D.d_un.d_ptr);
    }
    if (!Strings)
      continue;
    for (uint64_t Name : Names)
      if (const char *S = At(*Strings, Name, 1))
        Needed.emplace_back(S, strnlen(S, size_t(Bytes.end() - S)));
  }
  return Info;
}

} // namespace

std::vector<std::string> neededLibraries(StringRef Path) {
  return readDynamicInfo(Path).Needed;
}

std::string programInterpreter(StringRef Path) {
  DynamicInfo Info = readDynamicInfo(Path);
  return Info.Needed.empty() ? "" : Info.Interpreter;
}

namespace {

bool isLibTorch(StringRef Needed) {
  return Needed.starts_with("libtorch") || Needed.starts_with("libc10.so");
}

} // namespace

bool linksLibTorch(StringRef Program) {
  return llvm::any_of(neededLibraries(Program), isLibTorch);
}

bool reachesLibTorch(StringRef Program, function_ref<std::string(StringRef)> Resolve) {
  std::set<std::string> Seen;
  std::vector<std::string> Files = {Program.str()};
  // Breadth first: a program's libraries are a few dozen; the bound keeps a
  // hostile or looping graph finite.
  for (size_t I = 0; I < Files.size() && I < 4096; ++I)
    for (const std::string &Needed : neededLibraries(Files[I])) {
      if (isLibTorch(Needed))
        return true;
      if (!Seen.insert(Needed).second)
        continue;
      std::string File = Resolve(Needed);
      if (!File.empty())
        Files.push_back(std::move(File));
    }
  return false;
}

} // namespace ekka
