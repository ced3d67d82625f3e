//===- TensorDims.h - A tensor's sizes or strides ----------------*- C++ -*-===//
//
// Held inline up to six dimensions. The tracing runtime makes a record of
// every op output on the traced program's thread, and the writer's thread
// frees it: a heap block per dimension list, allocated on one thread and
// freed in bulk on another, leaves the program's thread without cached
// blocks and cost more than the rest of the record. The trace's records
// and the alignment's transforms share the type, so shapes pass between
// them without conversion.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_SUPPORT_TENSORDIMS_H
#define EKKA_SUPPORT_TENSORDIMS_H

#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <type_traits>
#include <utility>

namespace ekka {

/// SmallVector's moves are not noexcept; these are (moving int64_t cannot
/// throw), so that a growing std::vector or queue of records moves them
/// rather than copying every string they hold.
struct TensorDims : llvm::SmallVector<int64_t, 6> {
  using SmallVector::SmallVector;
  TensorDims() = default;
  TensorDims(const TensorDims &) = default;
  TensorDims(TensorDims &&O) noexcept : SmallVector(std::move(O)) {}
  TensorDims &operator=(const TensorDims &) = default;
  TensorDims &operator=(TensorDims &&O) noexcept {
    SmallVector::operator=(std::move(O));
    return *this;
  }
};
static_assert(std::is_nothrow_move_constructible_v<TensorDims>);

} // namespace ekka

#endif
