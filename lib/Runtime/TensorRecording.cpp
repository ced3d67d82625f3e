//===- TensorRecording.cpp ------------------------------------------------===//
#include "TensorRecording.h"
#include "DeviceStats.h"
#include "SessionInternal.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <dlfcn.h>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

namespace ekka {

std::optional<DType> traceDType(const at::Tensor &T) {
  switch (T.scalar_type()) {
  case at::kBool: return DType::Bool;
  case at::kByte: return DType::U8;
  case at::kChar: return DType::I8;
  case at::kShort: return DType::I16;
  case at::kUInt16: return DType::U16;
  case at::kUInt32: return DType::U32;
  case at::kUInt64: return DType::U64;
  case at::kInt: return DType::I32;
  case at::kLong: return DType::I64;
  case at::kHalf: return DType::F16;
  case at::kBFloat16: return DType::BF16;
  case at::kFloat: return DType::F32;
  case at::kDouble: return DType::F64;
  case at::kFloat8_e4m3fn: return DType::F8E4M3;
  case at::kFloat8_e5m2: return DType::F8E5M2;
  case at::kFloat8_e4m3fnuz: return DType::F8E4M3FNUZ;
  case at::kFloat8_e5m2fnuz: return DType::F8E5M2FNUZ;
  case at::kFloat8_e8m0fnu: return DType::F8E8M0;
  case at::kFloat4_e2m1fn_x2: return DType::F4;
  case at::kComplexHalf: return DType::C32;
  case at::kComplexFloat: return DType::C64;
  case at::kComplexDouble: return DType::C128;
  default: return std::nullopt;
  }
}

TensorStats statsOfDoubles(const double *V) {
  TensorStats S;
  S.Sum = V[0];
  S.SumSq = V[1];
  S.Min = V[2];
  S.Max = V[3];
  S.NanCount = int64_t(V[4]);
  S.InfCount = int64_t(V[5]);
  return S;
}

at::Tensor logicalValues(const at::Tensor &T) {
  if (!T.is_neg() && !T.is_conj())
    return T;
  OwnOps Own;
  return T.detach().resolve_conj().resolve_neg();
}

at::Tensor realValues(const at::Tensor &T) {
  at::Tensor V = logicalValues(T);
  if (!V.is_complex())
    return V;
  OwnOps Own;
  return at::view_as_real(V.detach());
}

/// \p V's values, contiguous and on the CPU where \p ToHost: \p V itself
/// where it is so already. Only the copy runs under OwnOps: turning
/// RecordFunction off and on again rebuilds the thread's callbacks (0.5 us,
/// which a module's every output would pay).
at::Tensor contiguousValues(const at::Tensor &V, bool ToHost = false) {
  if (V.is_contiguous() && (!ToHost || V.device().is_cpu()))
    return V;
  OwnOps Own;
  return ToHost ? V.detach().to(at::kCPU).contiguous() : V.detach().contiguous();
}

int64_t valueCount(const at::Tensor &T) {
  return T.numel() * (T.is_complex() || T.scalar_type() == at::kFloat4_e2m1fn_x2 ? 2 : 1);
}

std::string_view deviceName(c10::Device D) {
  // Plain bytes, never destroyed: still there for an op of the thread's
  // last destructors. A name that does not fit is made each time.
  struct Entry {
    int8_t Type, Index;
    uint8_t Size; // 0: empty
    char Text[45];
  };
  thread_local Entry Names[8];
  thread_local unsigned Next;
  for (const Entry &E : Names)
    if (E.Size && E.Type == int8_t(D.type()) && E.Index == int8_t(D.index()))
      return std::string_view(E.Text, E.Size);
  std::string Name = D.str();
  if (Name.empty() || Name.size() > sizeof(Entry::Text)) {
    thread_local std::string Long;
    Long = std::move(Name);
    return Long;
  }
  Entry &E = Names[Next++ % std::size(Names)];
  E.Type = int8_t(D.type());
  E.Index = int8_t(D.index());
  E.Size = uint8_t(Name.size());
  std::memcpy(E.Text, Name.data(), Name.size());
  return std::string_view(E.Text, E.Size);
}

bool describeTensor(const at::Tensor &T, TensorRecord &R) {
  auto Type = traceDType(T);
  at::Layout L = T.layout();
  if (!Type || T.is_quantized() || T.is_nested() || L == at::kSparse || L == at::kSparseCsr ||
      L == at::kSparseCsc || L == at::kSparseBsr || L == at::kSparseBsc)
    return false; // describeValues' to describe

  R.Type = *Type;
  R.Shape.assign(T.sizes().begin(), T.sizes().end());
  if (T.layout() == at::kStrided)
    R.Strides.assign(T.strides().begin(), T.strides().end());
  if (*Type == DType::F4) {
    // Counted in 4-bit elements, as safetensors counts them: a byte's two
    // are the last dimension's (a scalar byte: a pair). Strides in them
    // only where a byte's two are next to each other in it.
    if (R.Shape.empty()) {
      R.Shape = {2};
      R.Strides = {1};
    } else {
      R.Shape.back() *= 2;
      if (!R.Strides.empty() && (R.Strides.back() == 1 || T.size(-1) <= 1)) {
        for (int64_t &S : R.Strides)
          S *= 2;
        R.Strides.back() = 1;
      } else {
        R.Strides.clear();
      }
    }
  }
  R.Device = deviceName(T.device());
  return true;
}

bool describeValues(const at::Tensor &T, TensorRecord &R, at::Tensor *Values, int64_t &Zeros) {
  if (T.key_set().has(c10::DispatchKey::Python))
    return false;
  OwnOps Own;
  try {
    at::Tensor V;
    switch (T.layout()) {
    case at::kSparse: R.Layout = "sparse_coo"; break;
    case at::kSparseCsr: R.Layout = "sparse_csr"; break;
    case at::kSparseCsc: R.Layout = "sparse_csc"; break;
    case at::kSparseBsr: R.Layout = "sparse_bsr"; break;
    case at::kSparseBsc: R.Layout = "sparse_bsc"; break;
    default:
      if (T.is_nested())
        R.Layout = "nested";
      else if (T.is_quantized())
        R.Layout = "quantized";
      else
        return false;
    }
    Zeros = 0;
    std::optional<DType> Type = T.is_quantized() ? DType::F32 : traceDType(T);
    int64_t Count = 0; // a nested tensor's values
    if (!Values) {
      // Described only (no statistics wanted): nothing copied or coalesced.
      if (T.is_nested())
        for (const at::Tensor &P : T.detach().unbind())
          Count += P.numel();
    } else {
      if (T.layout() == at::kSparse) {
        V = T.detach().coalesce().values();
        Zeros = T.numel() - V.numel();
      } else if (R.Layout.rfind("sparse_", 0) == 0) {
        V = T.detach().values();
        Zeros = T.numel() - V.numel();
      } else if (T.is_nested()) {
        std::vector<at::Tensor> Parts;
        for (const at::Tensor &P : T.detach().unbind())
          Parts.push_back(P.reshape({-1}));
        V = Parts.empty() ? at::empty({0}, T.options().layout(at::kStrided)) : at::cat(Parts);
      } else {
        V = T.detach().dequantize();
      }
      Type = traceDType(V);
      Count = V.numel();
      if (V.layout() != at::kStrided)
        return false;
    }
    if (!Type)
      return false;
    R.Type = *Type;
    if (T.is_nested())
      R.Shape = {Count};
    else
      R.Shape.assign(T.sizes().begin(), T.sizes().end());
    R.Strides.clear();
    R.Device = deviceName(T.device());
    if (Values)
      *Values = std::move(V);
    return true;
  } catch (const std::exception &) {
    R.Layout.clear();
    return false;
  }
}

bool isJagged(const at::Tensor &T) {
  // Nested, and a subclass that Python dispatches: the only such tensor is
  // torch.nested's jagged one (asking its layout() would run Python).
  return T.defined() && T.is_nested() && T.key_set().has(c10::DispatchKey::Python);
}

at::Tensor jaggedValues(const at::Tensor &T) {
  // Under the program's own TorchDispatchMode (a logging mode, FakeTensor)
  // the mode would see the question as a call of the program's.
  if (!isJagged(T) || c10::impl::TorchDispatchModeTLS::stack_len() > 0)
    return {};
  at::RecordFunctionGuard NoRecord(false); // the program's own dispatch runs: see above
  c10::NoGradGuard NoGrad;
  try {
    // With holes (made with `lengths`, or narrowed), the packed values hold
    // what no sequence has: not the tensor's values.
    if (at::_nested_get_lengths(T).defined())
      return {};
    at::Tensor V = at::_nested_get_values(T);
    if (!V.defined() || V.layout() != at::kStrided || V.key_set().has(c10::DispatchKey::Python))
      return {};
    return V;
  } catch (const std::exception &) {
    return {};
  }
}

TensorStats withZeros(TensorStats S, int64_t Zeros) {
  if (Zeros <= 0)
    return S;
  // Min and max skip NaNs (NaN only when every element is one): a zero is
  // a number.
  S.Min = std::isnan(S.Min) ? 0.0 : std::min(S.Min, 0.0);
  S.Max = std::isnan(S.Max) ? 0.0 : std::max(S.Max, 0.0);
  return S;
}

namespace {

/// The two e2m1 values of each of \p Bytes (a uint8 tensor), side by side
/// in a new last dimension, the low bits' first: decoded arithmetically
/// (sign, exponent, mantissa) as floats.
at::Tensor float4Pairs(const at::Tensor &Bytes) {
  at::Tensor Codes = at::stack({Bytes.bitwise_and(0xF), Bytes.bitwise_right_shift(4)}, -1);
  at::Tensor Exp = Codes.bitwise_right_shift(1).bitwise_and(3).to(at::kFloat);
  at::Tensor Mant = Codes.bitwise_and(1).to(at::kFloat);
  // Exponent 0: 0 or 0.5 (subnormal); else (1 + m/2) * 2^(e-1).
  at::Tensor Magnitude =
      at::where(Exp == 0, Mant * 0.5, (Mant * 0.5 + 1) * at::exp2(Exp - 1));
  return at::where(Codes.bitwise_and(8) != 0, -Magnitude, Magnitude);
}

/// The values of a float4_e2m1fn_x2 tensor, a byte's two side by side, as
/// halves (exact: e2m1 has one mantissa bit), ATen having no conversion for
/// the type: looked up by byte in a table of the 256 bytes' pairs, made
/// where the tensor is. Eight bytes of memory per byte of the tensor (its
/// bytes as 32-bit indices, the pairs), where decoding it in place would
/// take some forty: an fp4 weight is large.
at::Tensor float4Values(const at::Tensor &T) {
  at::Tensor Table =
      float4Pairs(at::arange(256, T.options().dtype(at::kInt)).to(at::kByte)).to(at::kHalf);
  return at::embedding(Table, T.contiguous().view(at::kByte).to(at::kInt));
}

/// Sum, sum of squares, min, max, NaN and Inf counts of \p T, as six
/// doubles computed where \p T is (asynchronously on a GPU) by ATen's
/// reductions: ones that accumulate in double without a double copy of the
/// tensor, and one stack that promotes their results. The second is the
/// 2-norm; statsOfSix squares it. Min and max skip NaNs, as statsOfBytes's
/// do (statsOfSix makes them NaN when every element is one).
at::Tensor statsOnDevice(const at::Tensor &T) {
  at::Tensor X = realValues(T).detach();
  bool Floating = X.is_floating_point(); // only these hold NaNs
  switch (X.scalar_type()) {
  case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble: break;
  // The small floats, which ATen cannot sum, widened only as far as holds
  // each value exactly: float8 but e8m0 to half (their exponents and
  // mantissas fit), e8m0's powers of two (2^-127 to 2^127) to float.
  case at::kFloat8_e4m3fn: case at::kFloat8_e5m2: case at::kFloat8_e4m3fnuz:
  case at::kFloat8_e5m2fnuz:
    X = X.to(at::kHalf);
    Floating = true;
    break;
  case at::kFloat8_e8m0fnu:
    X = X.to(at::kFloat);
    Floating = true; // whatever ATen says of the type: its 0xFF is NaN
    break;
  case at::kFloat4_e2m1fn_x2:
    X = float4Values(X);
    Floating = false; // e2m1 has no NaN
    break;
  default: X = X.to(at::kDouble); // integers, booleans
  }
  at::Tensor Min, Max, Nan;
  if (Floating) {
    Nan = at::isnan(X);
    const double Inf = std::numeric_limits<double>::infinity();
    Min = at::amin(X.masked_fill(Nan, Inf));
    Max = at::amax(X.masked_fill(Nan, -Inf));
  } else {
    std::tie(Min, Max) = at::aminmax(X);
  }
  return at::stack({at::sum(X, at::kDouble),
                    at::linalg_vector_norm(X, 2, std::nullopt, false, at::kDouble), Min, Max,
                    Floating ? Nan.sum() : at::zeros({}, X.options().dtype(at::kLong)),
                    at::isinf(X).sum()})
      .to(at::kDouble);
}

/// The statistics of \p N elements from statsOnDevice's six doubles.
TensorStats statsOfSix(const at::Tensor &Host, int64_t N) {
  TensorStats S = statsOfDoubles(Host.const_data_ptr<double>());
  S.SumSq *= S.SumSq; // the norm
  if (N > 0 && S.NanCount == N)
    S.Min = S.Max = std::numeric_limits<double>::quiet_NaN();
  return S;
}

} // namespace

TensorStats tensorStats(const at::Tensor &T) {
  // Our own ops (only where a copy is needed) run under OwnOps, which
  // logicalValues, contiguousValues and statsByReductions take.
  TensorStats S;
  if (T.numel() == 0)
    return S;
  if (T.device().is_cpu() && T.layout() == at::kStrided) {
    // One pass over the bytes, as the writer does for what it is handed:
    // on the program's thread, where the tensor was just written and sits
    // in the cache (reading it costs less than a copy for the writer's
    // thread would, whose fresh pages the kernel must first clear).
    at::Tensor C = contiguousValues(logicalValues(T));
    if (auto Type = traceDType(C)) {
      llvm::StringRef Bytes(static_cast<const char *>(C.const_data_ptr()),
                            size_t(C.numel()) * C.element_size());
      if (auto Stats = statsOfBytes(*Type, Bytes))
        return *Stats;
    }
  }
  // On a GPU, or an element type the loop does not know: reductions there,
  // brought back in one transfer.
  return statsByReductions(T);
}

TensorStats statsByReductions(const at::Tensor &T) {
  OwnOps Own;
  if (T.numel() == 0)
    return TensorStats();
  return statsOfSix(statsOnDevice(T).cpu(), valueCount(T));
}

DeferredStats::DeferredStats(std::optional<TensorStats> Known)
    : State(Settled), Stats(std::move(Known)) {}

DeferredStats::DeferredStats(at::Tensor T, DType Type, std::atomic<int64_t> &Unavailable)
    : State(Pending), Tensor(std::move(T)), Storage(Tensor.storage().unsafeGetStorageImpl()),
      Data(static_cast<const char *>(Tensor.const_data_ptr())),
      StorageData(Storage->data_ptr().get()), StorageBytes(Storage->nbytes()),
      Bytes(uint64_t(Tensor.numel()) * Tensor.element_size()), Type(Type),
      Unavailable(&Unavailable) {}

DeferredStats::DeferredStats(std::function<std::optional<TensorStats>()> Later)
    : State(Pending), Later(std::move(Later)) {}

const std::optional<TensorStats> &DeferredStats::resolve() {
  int Expected = Pending;
  if (State.compare_exchange_strong(Expected, Computing, std::memory_order_acquire)) {
    if (Later) {
      Stats = std::exchange(Later, nullptr)();
      State.store(Settled, std::memory_order_release);
      return Stats;
    }
    // What ops do to the tensor, beforeWrite() sees; not a storage resized
    // or moved to shared memory in place (UntypedStorage.resize_,
    // share_memory_), which frees the bytes: then they are not read.
    if (Storage->data_ptr().get() == StorageData && Storage->nbytes() == StorageBytes &&
        Storage->device_type() == c10::DeviceType::CPU)
      Stats = statsOfBytes(Type, llvm::StringRef(Data, Bytes));
    if (!Stats)
      ++*Unavailable;
    State.store(Settled, std::memory_order_release);
    return Stats;
  }
  while (State.load(std::memory_order_acquire) != Settled)
    std::this_thread::yield(); // another thread is computing them: a pass over the bytes
  return Stats;
}

const std::optional<TensorStats> *DeferredStats::settled() const {
  return State.load(std::memory_order_acquire) == Settled ? &Stats : nullptr;
}

std::shared_ptr<DeferredStats> DeferredStatsQueue::defer(const at::Tensor &T) {
  if (!T.device().is_cpu() || T.layout() != at::kStrided || !T.has_storage() ||
      !T.is_contiguous() || T.is_neg() || T.is_conj())
    return nullptr;
  std::optional<DType> Type = traceDType(T);
  uint64_t Bytes = uint64_t(T.numel()) * T.element_size();
  if (!Type || Bytes < MinBytes)
    return nullptr;
  std::lock_guard<std::mutex> Lock(Mutex);
  if (Stopped || HeldBytes + Bytes > MaxHeldBytes)
    return nullptr;
  auto Job = std::make_shared<DeferredStats>(T, *Type, Unavailable);
  Held.push_back(Job);
  HeldBytes += Bytes;
  Count.store(Held.size(), std::memory_order_relaxed);
  return Job;
}

void DeferredStatsQueue::stop() {
  std::lock_guard<std::mutex> Lock(Mutex);
  Stopped = true;
}

void DeferredStatsQueue::beforeWrite(const at::Tensor &T) {
  if (!holding() || !T.defined() || !T.has_storage())
    return;
  const c10::StorageImpl *Storage = T.storage().unsafeGetStorageImpl();
  std::vector<std::shared_ptr<DeferredStats>> Written;
  {
    std::lock_guard<std::mutex> Lock(Mutex);
    for (const auto &Job : Held)
      if (Job->storage() == Storage && !Job->settled())
        Written.push_back(Job);
  }
  for (const auto &Job : Written)
    Job->resolve();
}

void DeferredStatsQueue::settleAll() {
  std::vector<std::shared_ptr<DeferredStats>> All;
  {
    std::lock_guard<std::mutex> Lock(Mutex);
    All.assign(Held.begin(), Held.end());
  }
  for (const auto &Job : All)
    Job->resolve();
}

void DeferredStatsQueue::releaseSettled() {
  if (!holding()) // every module call asks: most hold nothing
    return;
  std::vector<std::shared_ptr<DeferredStats>> Done;
  {
    std::lock_guard<std::mutex> Lock(Mutex);
    if (Held.empty())
      return;
    auto Kept = Held.begin();
    for (auto It = Held.begin(); It != Held.end(); ++It) {
      if ((*It)->settled()) {
        HeldBytes -= (*It)->bytes();
        Done.push_back(std::move(*It));
        continue;
      }
      if (Kept != It)
        *Kept = std::move(*It);
      ++Kept;
    }
    Held.erase(Kept, Held.end());
    Count.store(Held.size(), std::memory_order_relaxed);
  }
  // Outside the lock: a release may take the GIL.
  for (const auto &Job : Done)
    Job->release();
}

void tensorBytes(const at::Tensor &T, std::string &Out) {
  at::Tensor C = contiguousValues(logicalValues(T), /*ToHost=*/true);
  Out.assign(static_cast<const char *>(C.const_data_ptr()), size_t(C.numel()) * C.element_size());
}

namespace {

/// A function of the CUDA driver that the program has loaded; null where
/// none is loaded (nothing on a GPU then).
void *driverFunction(const char *Name) {
  void *Cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return Cuda ? dlsym(Cuda, Name) : nullptr;
}

/// While it lives, the calling thread's waits for the GPU leave other
/// threads' CUDA graph captures alone. Waiting on an event is one of CUDA's
/// "potentially unsafe" calls: made in the default (global) mode while
/// another thread captures a graph in global mode (torch.cuda.graph's
/// default, as vLLM captures), it fails, and the program's capture is
/// invalidated. For the wait the thread's mode is made thread-local, which
/// ignores other threads' captures (cuThreadExchangeStreamCaptureMode, as
/// PyTorch's NCCL watchdog does for its event queries), and then restored.
class IgnoringOtherThreadsCaptures {
public:
  IgnoringOtherThreadsCaptures() {
    ExchangeFn Exchange = exchange();
    if (!Exchange || Exchange(&Mode) != 0)
      return;
    Swapped = true;
    if (Mode == 2) { // relaxed already, which is laxer still: kept
      Exchange(&Mode);
      Swapped = false;
    }
  }
  ~IgnoringOtherThreadsCaptures() {
    if (Swapped)
      exchange()(&Mode);
  }
  IgnoringOtherThreadsCaptures(const IgnoringOtherThreadsCaptures &) = delete;
  IgnoringOtherThreadsCaptures &operator=(const IgnoringOtherThreadsCaptures &) = delete;

private:
  using ExchangeFn = int (*)(int *); // CUresult (CUstreamCaptureMode *)
  static ExchangeFn exchange() {
    static ExchangeFn F =
        reinterpret_cast<ExchangeFn>(driverFunction("cuThreadExchangeStreamCaptureMode"));
    return F;
  }
  int Mode = 1; // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL; then the mode it had
  bool Swapped = false;
};

/// Whether \p S, a CUDA stream, is capturing a CUDA graph: a read-back
/// enqueued there would become part of the graph instead of running now
/// (and the event recorded after it would never complete). Asked of the
/// driver the program has loaded; a stream it cannot answer for counts as
/// capturing.
bool streamCapturing(const c10::Stream &S) {
  if (S.device_type() != c10::DeviceType::CUDA)
    return false;
  using IsCapturingFn = int (*)(void *, int *); // cuStreamIsCapturing
  static IsCapturingFn IsCapturing =
      reinterpret_cast<IsCapturingFn>(driverFunction("cuStreamIsCapturing"));
  if (!IsCapturing)
    return false; // no driver loaded here: no graph either
  int Status = 0;
  try {
    return IsCapturing(S.native_handle(), &Status) != 0 || Status != 0;
  } catch (...) {
    return true;
  }
}

} // namespace

bool capturingGraph(const at::Tensor &T) {
  if (!T.is_cuda())
    return false;
  return streamCapturing(c10::impl::getDeviceGuardImpl(T.device().type())->getStream(T.device()));
}

namespace {

#if EKKA_HAVE_DEVICE_STATS
/// The type the kernel reads \p T's values (or a complex tensor's parts) as.
std::optional<DeviceStatsType> deviceStatsType(const at::Tensor &T) {
  switch (T.scalar_type()) {
  case at::kFloat: case at::kComplexFloat: return DeviceStatsType::F32;
  case at::kDouble: case at::kComplexDouble: return DeviceStatsType::F64;
  case at::kHalf: case at::kComplexHalf: return DeviceStatsType::F16;
  case at::kBFloat16: return DeviceStatsType::BF16;
  default: return std::nullopt;
  }
}
#endif

#if EKKA_HAVE_DEVICE_STATS
/// The statistics of one launch of this library's kernel (DeviceStats.h):
/// waited for once, by the first to need them, or when dropped unread (the
/// slots are reused only once the kernel is done).
class StatsLaunch : public DeviceStatsBatcher::Launch {
public:
  explicit StatsLaunch(DeviceStatsTicket Ticket) : Ticket(std::move(Ticket)) {}
  ~StatsLaunch() override { wait(); }
  std::optional<TensorStats> stats(size_t I) override {
    wait();
    if (!Ok || I >= Ticket.Slots.size())
      return std::nullopt;
    return statsOfDoubles(&Values[6 * I]);
  }

private:
  void wait() {
    std::call_once(Waited, [&] {
      Values.resize(6 * Ticket.Slots.size());
      InsideEkkaScope Inside; // a synchronisation of Ekka's, not the program's
      IgnoringOtherThreadsCaptures Waiting;
      Ok = awaitDeviceStats(Ticket, Values.data());
    });
  }
  DeviceStatsTicket Ticket;
  std::once_flag Waited;
  bool Ok = false;
  std::vector<double> Values;
};
#endif

} // namespace

at::Tensor kernelStatsValues(const at::Tensor &T, c10::Stream &Stream, bool &OutOfMemory) {
#if EKKA_HAVE_DEVICE_STATS
  if (!deviceStatsType(T) || T.layout() != at::kStrided || !T.is_cuda())
    return at::Tensor();
  Stream = c10::impl::getDeviceGuardImpl(T.device().type())->getStream(T.device());
  if (!prepareDeviceStats(T.device().index(), Stream.native_handle()))
    return at::Tensor();
  try {
    return contiguousValues(realValues(T));
  } catch (const c10::OutOfMemoryError &) {
    OutOfMemory = true;
  } catch (const std::exception &) {
    // no data pointer of its own: ATen's reductions may take it
  }
#endif
  return at::Tensor();
}

std::shared_ptr<DeviceStatsBatcher::Launch> launchDeviceStats(const std::vector<at::Tensor> &Values,
                                                              const c10::Stream &Stream,
                                                              DeviceStatsCounts &Counts) {
#if EKKA_HAVE_DEVICE_STATS
  OwnOps Own;
  TracerTimer Submit(TracerPart::DeviceSubmit);
  // On any thread (the writer's too, or one inside the caching allocator,
  // whose event record called back: nothing here allocates through it),
  // while another may capture a graph in global mode: a wait for a chunk
  // must not invalidate that capture.
  IgnoringOtherThreadsCaptures NotTheirs;
  c10::DeviceGuard OnDevice(Stream.device());
  if (Values.empty() || Values.size() > DeviceStatsBatcher::MaxItems || streamCapturing(Stream))
    return nullptr; // would become part of the graph
  std::vector<DeviceStatsItem> Items;
  for (const at::Tensor &V : Values)
    Items.push_back({*deviceStatsType(V), V.const_data_ptr(), V.numel()});
  DeviceStatsTicket Ticket;
  if (!enqueueDeviceStats(Stream.device_index(), Items.data(), int(Items.size()),
                          Stream.native_handle(), Ticket))
    return nullptr;
  ++Counts.KernelLaunches;
  Counts.ByKernel += int64_t(Values.size());
  return std::make_shared<StatsLaunch>(std::move(Ticket));
#else
  (void)Values, (void)Stream, (void)Counts;
  return nullptr;
#endif
}

std::shared_ptr<DeferredStats> DeviceStatsBatcher::defer(at::Tensor Values,
                                                         const c10::Stream &Stream, bool Now) {
  auto E = std::make_shared<Entry>(Stream);
  E->Storage = Values.storage().unsafeGetStorageImpl();
  E->StorageData = E->Storage->data_ptr().get();
  E->StorageBytes = E->Storage->nbytes();
  E->Bytes = uint64_t(Values.numel()) * Values.element_size();
  E->Values = std::move(Values);
  // The entry does not hold its statistics (no cycle): the records do.
  auto Stats = std::make_shared<DeferredStats>([this, E] { return await(E); });
  E->Stats = Stats;
  at::Tensor Unheld; // let go after the lock: it may be the last reference
  std::lock_guard<std::mutex> Lock(Mutex);
  bool Hold = HeldBytes + E->Bytes <= MaxHeld;
  Held.push_back(E);
  ++Unlaunched;
  UnlaunchedBytes += E->Bytes;
  HeldBytes += E->Bytes;
  HeldCount.store(Held.size(), std::memory_order_relaxed);
  Waiting.store(Unlaunched, std::memory_order_relaxed);
  if (Now || Stopped || !Hold || Unlaunched >= MaxItems || UnlaunchedBytes >= MaxUnlaunchedBytes)
    launchLocked();
  if (!Hold) {
    // Enqueued: the caller's reference keeps the memory until then.
    HeldBytes -= E->Bytes;
    E->Bytes = 0;
    Unheld = std::move(E->Values);
  }
  return Stats;
}

void DeviceStatsBatcher::launchLocked() {
  if (!Unlaunched)
    return;
  // By stream, each stream's in the order they were handed over; not one
  // whose storage's memory was freed or moved outside ops since.
  std::vector<std::pair<c10::Stream, std::vector<std::shared_ptr<Entry>>>> Groups;
  for (size_t I = Held.size() - Unlaunched; I < Held.size(); ++I) {
    const std::shared_ptr<Entry> &E = Held[I];
    if (E->Storage->data_ptr().get() != E->StorageData ||
        E->Storage->nbytes() != E->StorageBytes) {
      E->Launched = true; // without statistics
      continue;
    }
    auto It = std::find_if(Groups.begin(), Groups.end(),
                           [&](const auto &G) { return G.first == E->Stream; });
    if (It == Groups.end())
      It = Groups.insert(Groups.end(), {E->Stream, {}});
    It->second.push_back(E);
  }
  for (auto &[Stream, Entries] : Groups)
    for (size_t First = 0; First < Entries.size(); First += MaxItems) {
      size_t Count = std::min(MaxItems, Entries.size() - First);
      std::vector<at::Tensor> Values;
      for (size_t I = 0; I < Count; ++I)
        Values.push_back(Entries[First + I]->Values);
      std::shared_ptr<Launch> Batch;
      try {
        Batch = Launcher(Values, Stream);
      } catch (...) {
        // not launched: these go without statistics
      }
      for (size_t I = 0; I < Count; ++I) {
        Entry &E = *Entries[First + I];
        E.Batch = Batch;
        E.Index = I;
        E.Launched = true;
      }
    }
  Unlaunched = 0;
  UnlaunchedBytes = 0;
  Waiting.store(0, std::memory_order_relaxed);
  LaunchDone.notify_all();
}

std::optional<TensorStats> DeviceStatsBatcher::await(const std::shared_ptr<Entry> &E) {
  {
    std::unique_lock<std::mutex> Lock(Mutex);
    if (!E->Launched && !LaunchDone.wait_for(Lock, Patience, [&] { return E->Launched; }))
      launchLocked(); // nothing in the program launched them meanwhile
  }
  return E->Batch ? E->Batch->stats(E->Index) : std::nullopt;
}

void DeviceStatsBatcher::beforeWrite(const at::Tensor &T) {
  if (!waiting() || !T.defined() || !T.has_storage())
    return;
  const c10::StorageImpl *Storage = T.storage().unsafeGetStorageImpl();
  std::lock_guard<std::mutex> Lock(Mutex);
  for (size_t I = Held.size() - Unlaunched; I < Held.size(); ++I)
    if (Held[I]->Storage == Storage) {
      launchLocked();
      return;
    }
}

void DeviceStatsBatcher::launchAll() {
  if (!waiting())
    return;
  std::lock_guard<std::mutex> Lock(Mutex);
  launchLocked();
}

void DeviceStatsBatcher::stop() {
  std::lock_guard<std::mutex> Lock(Mutex);
  Stopped = true;
}

void DeviceStatsBatcher::settleAll() {
  std::vector<std::shared_ptr<DeferredStats>> All;
  {
    std::lock_guard<std::mutex> Lock(Mutex);
    launchLocked();
    for (const auto &E : Held)
      if (auto Stats = E->Stats.lock())
        All.push_back(std::move(Stats));
  }
  for (const auto &Stats : All)
    Stats->resolve();
}

void DeviceStatsBatcher::releaseSettled() {
  if (!holding())
    return;
  std::vector<std::shared_ptr<Entry>> Done;
  {
    std::lock_guard<std::mutex> Lock(Mutex);
    size_t Launched = Held.size() - Unlaunched;
    auto Kept = Held.begin();
    for (size_t I = 0; I < Held.size(); ++I) {
      auto Stats = Held[I]->Stats.lock();
      if (I < Launched && (!Stats || Stats->settled())) {
        HeldBytes -= std::exchange(Held[I]->Bytes, 0);
        Done.push_back(std::move(Held[I]));
        continue;
      }
      if (Kept != Held.begin() + I)
        *Kept = std::move(Held[I]);
      ++Kept;
    }
    Held.erase(Kept, Held.end());
    HeldCount.store(Held.size(), std::memory_order_relaxed);
  }
  // Outside the lock: a release may take the GIL.
  for (const auto &E : Done)
    E->Values.reset();
}

namespace {

/// \p Source copied into pinned memory on \p Stream without waiting, and
/// the event after the copy, which says when the copy holds it.
std::pair<at::Tensor, std::shared_ptr<c10::Event>> copyToPinned(const at::Tensor &Source,
                                                                const c10::Stream &Stream) {
  at::Tensor Host = at::empty(Source.sizes(),
                              Source.options().device(at::kCPU).pinned_memory(true));
  Host.copy_(Source, /*non_blocking=*/true);
  auto Done = std::make_shared<c10::Event>(Stream.device_type());
  Done->record(Stream);
  return {Host, Done};
}

/// The pinned buffer of copyToPinned, once its copy is done (waited for in
/// thread-local capture mode); throws if the device does not deliver it.
/// Takes both out of the read-back: the caller, inside Ekka, lets them go
/// (freeing a pinned buffer records an event, the caching host
/// allocator's, which is no call of the program's that the GPU statistics
/// waiting should be launched before).
at::Tensor takeCopied(at::Tensor &Host, std::shared_ptr<c10::Event> &Done) {
  at::Tensor Buffer = std::move(Host);
  std::shared_ptr<c10::Event> Copied = std::move(Done);
  IgnoringOtherThreadsCaptures Waiting;
  Copied->synchronize();
  return Buffer;
}

/// The current stream of \p T's device.
c10::Stream currentStream(const at::Tensor &T) {
  return c10::impl::getDeviceGuardImpl(T.device().type())->getStream(T.device());
}

} // namespace

std::function<std::optional<TensorStats>()> deviceStats(const at::Tensor &T,
                                                        DeviceStatsCounts &Counts) {
  OwnOps Own;
  int64_t N = valueCount(T);
  if (N == 0)
    return [] { return std::optional<TensorStats>(TensorStats()); };
  c10::DeviceGuard OnDevice(T.device());
  TracerTimer Submit(TracerPart::DeviceSubmit);
  // The reductions' and the pinned buffer's allocations, while another
  // thread may capture a graph in global mode: they must not invalidate it.
  IgnoringOtherThreadsCaptures NotTheirs;
  auto [Host, Done] = copyToPinned(statsOnDevice(T), currentStream(T));
  ++Counts.ByReductions;
  return [Host, Done, N]() mutable -> std::optional<TensorStats> {
    InsideEkkaScope Inside;
    try {
      return statsOfSix(takeCopied(Host, Done), N);
    } catch (...) {
      return std::nullopt;
    }
  };
}

TraceWriter::Completion deviceBytes(const at::Tensor &T, std::atomic<int64_t> &Lost) {
  OwnOps Own;
  c10::DeviceGuard OnDevice(T.device());
  c10::Stream Stream = currentStream(T);
  TracerTimer Submit(TracerPart::DeviceSubmit);
  IgnoringOtherThreadsCaptures NotTheirs; // as deviceStats
  auto [Host, Done] = copyToPinned(logicalValues(T).detach().contiguous(), Stream);
  return [Host, Done, &Lost](TensorRecord &, std::optional<std::string> &Data) mutable {
    InsideEkkaScope Inside;
    try {
      at::Tensor Buffer = takeCopied(Host, Done);
      const char *P = static_cast<const char *>(Buffer.const_data_ptr());
      Data = std::string(P, P + Buffer.numel() * Buffer.element_size());
    } catch (...) {
      ++Lost; // the record stays, without what the device did not deliver
    }
  };
}

std::string DeviceStatsCounts::describe() const {
  int64_t Kernel = ByKernel.load(), Reductions = ByReductions.load();
  if (!Kernel && !Reductions)
    return "";
  std::string Out = std::to_string(Kernel) + " read back from Ekka's kernel (" +
                    std::to_string(KernelLaunches.load()) + " launches), " +
                    std::to_string(Reductions) + " from ATen's reductions";
#if EKKA_HAVE_DEVICE_STATS
  if (const char *Why = deviceStatsUnavailable())
    Out += " (Ekka's kernel could not be set up: " + std::string(Why) + ")";
#else
  Out += " (this runtime was built without nvcc)";
#endif
  return Out;
}

} // namespace ekka
