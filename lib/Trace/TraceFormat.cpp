//===- TraceFormat.cpp ----------------------------------------------------===//
#include "ekka/Trace/TraceFormat.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;

namespace ekka {

StringRef traceSchema() {
  return R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS module_calls(
  id INTEGER PRIMARY KEY,
  parent_id INTEGER,
  seq INTEGER NOT NULL,
  step INTEGER NOT NULL,
  path TEXT NOT NULL,
  class_name TEXT NOT NULL,
  class_qualname TEXT NOT NULL,
  source_file TEXT,
  source_line INTEGER);
CREATE TABLE IF NOT EXISTS ops(
  id INTEGER PRIMARY KEY,
  module_call_id INTEGER,
  seq INTEGER NOT NULL,
  name TEXT NOT NULL,
  schema TEXT);
CREATE TABLE IF NOT EXISTS kernels(
  id INTEGER PRIMARY KEY,
  op_id INTEGER,
  module_call_id INTEGER,
  seq INTEGER NOT NULL,
  name TEXT NOT NULL,
  grid TEXT NOT NULL,
  block TEXT NOT NULL,
  shared_mem INTEGER NOT NULL,
  stream INTEGER NOT NULL,
  correlation_id INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tensors(
  id INTEGER PRIMARY KEY,
  owner TEXT NOT NULL,
  owner_id INTEGER NOT NULL,
  role TEXT NOT NULL,
  idx INTEGER NOT NULL,
  dtype TEXT NOT NULL,
  shape TEXT NOT NULL,
  strides TEXT NOT NULL,
  device TEXT NOT NULL,
  sum REAL, sumsq REAL, min REAL, max REAL,
  nan_count INTEGER, inf_count INTEGER,
  shard TEXT,
  key TEXT,
  source_id INTEGER);
CREATE INDEX IF NOT EXISTS tensors_owner ON tensors(owner, owner_id);
CREATE INDEX IF NOT EXISTS ops_module_call ON ops(module_call_id);
CREATE INDEX IF NOT EXISTS kernels_op ON kernels(op_id);
)sql";
}

StringRef dtypeName(DType T) {
  switch (T) {
  case DType::Bool: return "BOOL";
  case DType::U8: return "U8";
  case DType::I8: return "I8";
  case DType::I16: return "I16";
  case DType::U16: return "U16";
  case DType::I32: return "I32";
  case DType::U32: return "U32";
  case DType::I64: return "I64";
  case DType::U64: return "U64";
  case DType::F16: return "F16";
  case DType::BF16: return "BF16";
  case DType::F32: return "F32";
  case DType::F64: return "F64";
  case DType::F8E4M3: return "F8_E4M3";
  case DType::F8E5M2: return "F8_E5M2";
  }
  return "?";
}

std::optional<DType> parseDType(StringRef Name) {
  return StringSwitch<std::optional<DType>>(Name)
      .Case("BOOL", DType::Bool)
      .Case("U8", DType::U8)
      .Case("I8", DType::I8)
      .Case("I16", DType::I16)
      .Case("U16", DType::U16)
      .Case("I32", DType::I32)
      .Case("U32", DType::U32)
      .Case("I64", DType::I64)
      .Case("U64", DType::U64)
      .Case("F16", DType::F16)
      .Case("BF16", DType::BF16)
      .Case("F32", DType::F32)
      .Case("F64", DType::F64)
      .Case("F8_E4M3", DType::F8E4M3)
      .Case("F8_E5M2", DType::F8E5M2)
      .Default(std::nullopt);
}

unsigned dtypeSize(DType T) {
  switch (T) {
  case DType::Bool:
  case DType::U8:
  case DType::I8:
  case DType::F8E4M3:
  case DType::F8E5M2:
    return 1;
  case DType::I16:
  case DType::U16:
  case DType::F16:
  case DType::BF16:
    return 2;
  case DType::I32:
  case DType::U32:
  case DType::F32:
    return 4;
  case DType::I64:
  case DType::U64:
  case DType::F64:
    return 8;
  }
  return 1;
}

std::string shardFileName(unsigned Index) {
  std::string Name;
  raw_string_ostream(Name) << format("tensors-%04u.safetensors", Index);
  return Name;
}

StringRef ownerName(TensorOwner O) {
  switch (O) {
  case TensorOwner::ModuleCall: return "module_call";
  case TensorOwner::Op: return "op";
  case TensorOwner::Kernel: return "kernel";
  }
  return "?";
}

std::optional<TensorOwner> parseOwner(StringRef Name) {
  return StringSwitch<std::optional<TensorOwner>>(Name)
      .Case("module_call", TensorOwner::ModuleCall)
      .Case("op", TensorOwner::Op)
      .Case("kernel", TensorOwner::Kernel)
      .Default(std::nullopt);
}

} // namespace ekka
