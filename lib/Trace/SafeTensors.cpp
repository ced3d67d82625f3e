//===- SafeTensors.cpp ----------------------------------------------------===//
#include "ekka/Trace/SafeTensors.h"
#include "ekka/Support/Error.h"
#include "ekka/Support/JSON.h"

#include "llvm/Support/Endian.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

using namespace llvm;

namespace ekka {

void SafeTensorsWriter::add(StringRef Name, DType Type, ArrayRef<int64_t> Shape,
                            StringRef Bytes) {
  add(Name, Type, Shape, Bytes.str());
}

void SafeTensorsWriter::add(StringRef Name, DType Type, ArrayRef<int64_t> Shape,
                            std::string &&Bytes) {
  SafeTensorInfo Info;
  Info.Name = Name.str();
  Info.Type = Type;
  Info.Shape.assign(Shape.begin(), Shape.end());
  Info.Begin = DataSize;
  DataSize += Bytes.size();
  Info.End = DataSize;
  Infos.push_back(std::move(Info));
  Data.push_back(std::move(Bytes));
}

void SafeTensorsWriter::clear() {
  Infos.clear();
  Data.clear();
  DataSize = 0;
}

std::vector<std::string> SafeTensorsWriter::takeBuffers() {
  std::vector<std::string> Buffers = std::move(Data);
  clear();
  return Buffers;
}

Error SafeTensorsWriter::writeTo(StringRef Path,
                                 const std::map<std::string, std::string> &Metadata) const {
  json::Object Header;
  if (!Metadata.empty()) {
    json::Object Meta;
    for (const auto &[K, V] : Metadata)
      Meta[K] = V;
    Header["__metadata__"] = std::move(Meta);
  }
  for (const SafeTensorInfo &I : Infos)
    Header[I.Name] = json::Object{{"dtype", dtypeName(I.Type)},
                                  {"shape", json::Array(I.Shape)},
                                  {"data_offsets", json::Array{I.Begin, I.End}}};
  std::string HeaderText;
  raw_string_ostream(HeaderText) << json::Value(std::move(Header));
  // The data section starts 8-byte aligned, as the reference writer does.
  HeaderText.append((8 - HeaderText.size() % 8) % 8, ' ');

  std::string Temp = (Path + ".tmp").str();
  std::error_code EC;
  {
    raw_fd_ostream OS(Temp, EC);
    if (EC)
      return makeError("cannot write '" + Temp + "': " + EC.message());
    char Length[8];
    support::endian::write64le(Length, HeaderText.size());
    OS.write(Length, 8);
    OS << HeaderText;
    for (const std::string &Bytes : Data)
      OS.write(Bytes.data(), Bytes.size());
    OS.close();
    if (OS.has_error()) {
      EC = OS.error();
      OS.clear_error();
      sys::fs::remove(Temp);
      return makeError("cannot write '" + Path + "': " + EC.message());
    }
  }
  if ((EC = sys::fs::rename(Temp, Path))) {
    sys::fs::remove(Temp);
    return makeError("cannot write '" + Path + "': " + EC.message());
  }
  return Error::success();
}

Expected<std::unique_ptr<SafeTensorsFile>> SafeTensorsFile::open(StringRef Path) {
  // A FIFO or a device (/dev/zero) would be read without end.
  if (sys::fs::exists(Path) && !sys::fs::is_regular_file(Path))
    return makeError("cannot read '" + Path + "': not a regular file");
  auto Buffer = MemoryBuffer::getFile(Path, /*IsText=*/false,
                                      /*RequiresNullTerminator=*/false);
  if (!Buffer)
    return makeError("cannot read '" + Path + "': " + Buffer.getError().message());
  return parse(std::move(*Buffer), Path);
}

Expected<std::unique_ptr<SafeTensorsFile>>
SafeTensorsFile::parse(std::unique_ptr<MemoryBuffer> Buffer, StringRef Path) {
  auto Bad = [&](const Twine &Why) {
    return makeError("'" + Path + "' is not a valid safetensors file: " + Why);
  };
  StringRef All = Buffer->getBuffer();
  if (All.size() < 8)
    return Bad("shorter than its 8-byte header length");
  uint64_t HeaderSize = support::endian::read64le(All.data());
  if (HeaderSize > All.size() - 8)
    return Bad("header length " + Twine(HeaderSize) + " runs past the end of the file (truncated?)");
  auto File = std::unique_ptr<SafeTensorsFile>(new SafeTensorsFile());
  File->DataSection = All.substr(8 + HeaderSize);
  // Entry by entry: a shard of many small tensors has a header of as many
  // entries, which parsed whole would take ~4 KB each.
  auto Entry = [&](StringRef Key, const json::Value &Value) -> Error {
    if (Key == "__metadata__") {
      if (const json::Object *M = Value.getAsObject())
        for (const auto &[MK, MV] : *M)
          if (auto S = MV.getAsString())
            File->Metadata[MK.str()] = S->str();
      return Error::success();
    }
    const json::Object *T = Value.getAsObject();
    if (!T)
      return Bad("entry '" + Key + "' is not an object");
    auto DTypeName = T->getString("dtype");
    const json::Array *Shape = T->getArray("shape");
    const json::Array *Offsets = T->getArray("data_offsets");
    if (!DTypeName || !Shape || !Offsets || Offsets->size() != 2)
      return Bad("entry '" + Key + "' lacks dtype, shape or data_offsets");
    SafeTensorInfo Info;
    Info.Name = Key.str();
    auto Type = parseDType(*DTypeName);
    if (!Type)
      return Bad("entry '" + Key + "' has unknown dtype '" + *DTypeName + "'");
    Info.Type = *Type;
    uint64_t Elements = 1;
    for (const json::Value &D : *Shape) {
      auto N = D.getAsInteger();
      if (!N || *N < 0)
        return Bad("entry '" + Key + "' has a bad shape");
      Info.Shape.push_back(*N);
      if (__builtin_mul_overflow(Elements, uint64_t(*N), &Elements))
        return Bad("entry '" + Key + "' has a shape too large to hold");
    }
    auto B = (*Offsets)[0].getAsInteger(), E = (*Offsets)[1].getAsInteger();
    if (!B || !E || *B < 0 || *E < *B || uint64_t(*E) > File->DataSection.size())
      return Bad("entry '" + Key + "' has data_offsets outside the file (truncated?)");
    Info.Begin = uint64_t(*B);
    Info.End = uint64_t(*E);
    std::optional<uint64_t> Size = dtypeBytes(Info.Type, Elements);
    if (!Size || Info.End - Info.Begin != *Size)
      return Bad("entry '" + Key + "' has " + Twine(Info.End - Info.Begin) +
                 " bytes for " + Twine(Elements) + " elements of " + *DTypeName);
    File->ByName[Info.Name] = File->Infos.size();
    File->Infos.push_back(std::move(Info));
    return Error::success();
  };
  // An entry's own error names the file already; the header's syntax not.
  bool EntryIsBad = false;
  auto Checked = [&](StringRef Key, const json::Value &Value) -> Error {
    Error E = Entry(Key, Value);
    EntryIsBad = bool(E);
    return E;
  };
  if (Error E = forEachJSONMember(All.substr(8, HeaderSize), Checked)) {
    if (EntryIsBad)
      return E;
    return Bad("header is not a valid JSON object (" + toString(std::move(E)) + ")");
  }
  // Each tensor's bytes are its own: entries that share bytes are not what
  // a writer makes.
  std::vector<const SafeTensorInfo *> ByOffset;
  for (const SafeTensorInfo &Info : File->Infos)
    if (Info.End > Info.Begin) // an empty tensor holds no bytes to share
      ByOffset.push_back(&Info);
  std::sort(ByOffset.begin(), ByOffset.end(), [](const SafeTensorInfo *A, const SafeTensorInfo *B) {
    return A->Begin < B->Begin;
  });
  for (size_t I = 1; I < ByOffset.size(); ++I)
    if (ByOffset[I]->Begin < ByOffset[I - 1]->End)
      return Bad("entries '" + ByOffset[I - 1]->Name + "' and '" + ByOffset[I]->Name +
                 "' overlap");
  File->Buffer = std::move(Buffer);
  return File;
}

const SafeTensorInfo *SafeTensorsFile::find(StringRef Name) const {
  auto It = ByName.find(Name);
  return It == ByName.end() ? nullptr : &Infos[It->second];
}

StringRef SafeTensorsFile::bytes(const SafeTensorInfo &Info) const {
  return DataSection.slice(Info.Begin, Info.End);
}

void SafeTensorsFile::dropResidentPages() const {
#if defined(__unix__) || defined(__APPLE__)
  // Only a mapping: the same advice on memory read into the heap would
  // zero it.
  if (Buffer->getBufferKind() != MemoryBuffer::MemoryBuffer_MMap)
    return;
  // A read-only file mapping, never written: its pages come back from the
  // file as they were.
  uintptr_t Page = uintptr_t(sys::Process::getPageSizeEstimate());
  uintptr_t Begin = uintptr_t(Buffer->getBufferStart()) & ~(Page - 1);
  uintptr_t End = uintptr_t(Buffer->getBufferEnd());
  ::madvise(reinterpret_cast<void *>(Begin), End - Begin, MADV_DONTNEED);
#endif
}

} // namespace ekka
