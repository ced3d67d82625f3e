//===- SafeTensors.h - Read and write the safetensors format ---*- C++ -*-===//
//
// Captured tensors are stored as safetensors: an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then
// the bytes. Anybody can open it with the `safetensors` package; nothing in it
// can execute code, unlike a pickled `.pt`.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_TRACE_SAFETENSORS_H
#define EKKA_TRACE_SAFETENSORS_H

#include "ekka/Trace/TraceFormat.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ekka {

/// One tensor's place in a safetensors file; offsets are relative to the
/// start of the data section.
struct SafeTensorInfo {
  std::string Name;
  DType Type = DType::F32;
  std::vector<int64_t> Shape;
  uint64_t Begin = 0, End = 0;
};

/// Collects tensors in memory and writes them as one safetensors file.
class SafeTensorsWriter {
public:
  /// Appends a tensor. \p Bytes must hold exactly product(Shape) elements.
  void add(llvm::StringRef Name, DType Type, llvm::ArrayRef<int64_t> Shape,
           llvm::StringRef Bytes);
  /// The same, keeping \p Bytes as they are until the file is written (no
  /// copy); takeBuffers() gives them back.
  void add(llvm::StringRef Name, DType Type, llvm::ArrayRef<int64_t> Shape,
           std::string &&Bytes);
  uint64_t dataBytes() const { return DataSize; }
  size_t size() const { return Infos.size(); }
  bool empty() const { return Infos.empty(); }

  /// Writes the file through `Path.tmp` and a rename, so a file at Path is
  /// always complete. A full disk is an error naming the path; the
  /// temporary file is removed.
  llvm::Error writeTo(llvm::StringRef Path,
                      const std::map<std::string, std::string> &Metadata = {}) const;
  void clear();
  /// The buffers the tensors were kept in, for reuse; the writer is empty
  /// afterwards.
  std::vector<std::string> takeBuffers();

private:
  std::vector<SafeTensorInfo> Infos;
  std::vector<std::string> Data; ///< The tensors' bytes, in file order.
  uint64_t DataSize = 0;
};

/// A safetensors file mapped into memory, its header validated.
class SafeTensorsFile {
public:
  static llvm::Expected<std::unique_ptr<SafeTensorsFile>> open(llvm::StringRef Path);
  /// The file whose bytes \p Buffer holds, named \p Path in errors: its
  /// header validated (lengths, JSON, dtypes, shapes against byte ranges,
  /// ranges inside the data and apart). What open() does after reading.
  /// \p Buffer is read, never written: a mapping among them is a file's
  /// as it is on disk, which dropResidentPages() may give back.
  static llvm::Expected<std::unique_ptr<SafeTensorsFile>>
  parse(std::unique_ptr<llvm::MemoryBuffer> Buffer, llvm::StringRef Path);

  llvm::ArrayRef<SafeTensorInfo> tensors() const { return Infos; }
  const SafeTensorInfo *find(llvm::StringRef Name) const;
  /// The bytes of a tensor of this file.
  llvm::StringRef bytes(const SafeTensorInfo &Info) const;
  /// Lets the kernel take back the pages of a mapped file that reading its
  /// tensors made resident (madvise MADV_DONTNEED): bytes() stays valid, a
  /// later read faults them in again from the page cache or the file.
  /// Nothing for a file read into memory (too small to map).
  void dropResidentPages() const;
  const std::map<std::string, std::string> &metadata() const { return Metadata; }

private:
  std::unique_ptr<llvm::MemoryBuffer> Buffer;
  llvm::StringRef DataSection;
  std::vector<SafeTensorInfo> Infos;
  llvm::StringMap<size_t> ByName;
  std::map<std::string, std::string> Metadata;
};

} // namespace ekka

#endif
