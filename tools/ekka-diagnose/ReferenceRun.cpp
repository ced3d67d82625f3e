//===- ReferenceRun.cpp - ekka-diagnose runs the reference itself ---------===//
#include "ReferenceRun.h"

#include "ekka/Analysis/ServedRequests.h"
#include "ekka/Support/Error.h"
#include "ekka/Trace/TraceReader.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <optional>

using namespace llvm;

namespace ekka {

namespace {

/// The model's vocabulary size from its config.json (a multimodal model's
/// text_config's), or 0.
Expected<int64_t> vocabSize(StringRef ModelDir) {
  SmallString<256> Config(ModelDir);
  sys::path::append(Config, "config.json");
  auto Buffer = MemoryBuffer::getFile(Config);
  if (!Buffer)
    return makeError("--reference-model: '" + ModelDir +
                     "' holds no config.json: not a HuggingFace model directory");
  auto Parsed = json::parse((*Buffer)->getBuffer());
  if (!Parsed)
    return makeError("--reference-model: '" + Config + "' is not JSON: " +
                     toString(Parsed.takeError()));
  const json::Object *Top = Parsed->getAsObject();
  if (!Top)
    return makeError("--reference-model: '" + Config + "' is not a JSON object");
  if (auto V = Top->getInteger("vocab_size"))
    return *V;
  if (const json::Object *Text = Top->getObject("text_config"))
    if (auto V = Text->getInteger("vocab_size"))
      return *V;
  return 0;
}

/// The reference's low precision: the target's (meta dtype).
std::string lowPrecision(const TraceReader &R) {
  auto It = R.meta().find("dtype");
  StringRef Type = It == R.meta().end() ? "" : StringRef(It->second).split(' ').first;
  if (Type.equals_insensitive("F16"))
    return "fp16";
  if (Type.equals_insensitive("F32"))
    return "fp32";
  return "bf16";
}

std::string readFile(StringRef Path) {
  auto Buffer = MemoryBuffer::getFile(Path);
  return Buffer ? (*Buffer)->getBuffer().str() : std::string();
}

/// The last non-empty line of a log, for the one error line.
std::string lastLine(StringRef Log) {
  SmallVector<StringRef, 64> Lines;
  StringRef(Log).split(Lines, '\n', -1, false);
  for (auto It = Lines.rbegin(); It != Lines.rend(); ++It)
    if (!It->trim().empty())
      return It->trim().str();
  return "";
}

Error traceOne(const ReferenceRunOptions &O, StringRef Tracer, StringRef Requests,
               StringRef Dtype, StringRef Out) {
  SmallString<256> Log(O.OutDir);
  sys::path::append(Log, (Dtype + ".log").str());
  std::vector<std::string> Args = {Tracer.str(), "-o", Out.str(), "--force", "--", O.Python,
                                   "-m", "ekka.reference", "--model", O.ModelDir,
                                   "--requests", Requests.str(), "--dtype", Dtype.str()};
  // The low-precision side's ops' statistics: the drill-down compares the
  // target's ops against them.
  if (Dtype != "fp32")
    Args.insert(Args.begin() + 4, "--op-stats");
  std::vector<StringRef> Refs(Args.begin(), Args.end());
  std::optional<StringRef> Redirects[] = {StringRef(""), StringRef(Log), StringRef(Log)};
  if (!O.Quiet)
    errs() << "ekka-diagnose: running the reference (" << Dtype << ") from '" << O.ModelDir
           << "'\n";
  std::string Err;
  int RC = sys::ExecuteAndWait(Tracer, Refs, std::nullopt, Redirects, 0, 0, &Err);
  if (RC != 0) {
    std::string Why = Err.empty() ? lastLine(readFile(Log)) : Err;
    return makeError("--reference-model: the reference run (" + Dtype + ") failed" +
                     (Why.empty() ? "" : ": " + Why) + " (its log: " + Log + ")");
  }
  return Error::success();
}

} // namespace

Expected<ReferenceTraces> runReference(ArrayRef<TraceReader *> Target,
                                       const ReferenceRunOptions &O) {
  if (!sys::fs::is_directory(O.ModelDir))
    return makeError("--reference-model: '" + O.ModelDir + "' is not a directory");
  auto Vocab = vocabSize(O.ModelDir);
  if (!Vocab)
    return Vocab.takeError();
  auto Requests = servedRequests(Target, *Vocab);
  if (!Requests)
    return makeError("--reference-model: " + toString(Requests.takeError()));
  SmallString<256> Model;
  if (std::error_code EC = sys::fs::real_path(O.ModelDir, Model))
    return makeError("--reference-model: '" + O.ModelDir + "': " + EC.message());
  std::string Low = lowPrecision(*Target.front());
  json::Object Job{{"model", std::string(Model)}, {"python", O.Python}, {"dtype", Low}};
  std::string Text = formatv("{0:2}", requestsJSON(*Requests)).str() + "\n";
  std::string JobText = formatv("{0:2}", json::Value(std::move(Job))).str() + "\n";

  if (std::error_code EC = sys::fs::create_directories(O.OutDir))
    return makeError("--reference-out: cannot create '" + O.OutDir + "': " + EC.message());
  SmallString<256> RequestsFile(O.OutDir), JobFile(O.OutDir), Done(O.OutDir);
  sys::path::append(RequestsFile, "requests.json");
  sys::path::append(JobFile, "job.json");
  sys::path::append(Done, "complete");
  ReferenceTraces Out;
  auto Dir = [&](StringRef Dtype) {
    SmallString<256> D(O.OutDir);
    sys::path::append(D, Dtype);
    return std::string(D);
  };
  Out.LowPrecision = Dir(Low);
  if (Low != "fp32")
    Out.FP32 = Dir("fp32");
  // The same requests of the same model, traced before: reused.
  if (sys::fs::exists(Done) && readFile(RequestsFile) == Text && readFile(JobFile) == JobText) {
    if (!O.Quiet)
      errs() << "ekka-diagnose: reusing the reference traces in '" << O.OutDir
             << "' (the same requests of the same model)\n";
    return Out;
  }
  // Anything else there is not overwritten: only a directory this option
  // made before (its requests.json) or an empty one.
  std::error_code EC;
  bool Empty = sys::fs::directory_iterator(O.OutDir, EC) == sys::fs::directory_iterator();
  if (!Empty && !sys::fs::exists(RequestsFile))
    return makeError("--reference-out: '" + O.OutDir +
                     "' holds files that --reference-model did not write: name another "
                     "directory");
  sys::fs::remove(Done);
  for (auto [File, Content] : {std::pair<StringRef, StringRef>{RequestsFile, Text},
                               {JobFile, JobText}}) {
    raw_fd_ostream OS(File, EC);
    OS << Content;
    OS.close();
    if (EC || OS.has_error())
      return makeError("--reference-out: cannot write '" + File + "'");
  }
  SmallString<256> Tracer(sys::path::parent_path(
      sys::fs::getMainExecutable(O.Argv0.c_str(), (void *)&runReference)));
  sys::path::append(Tracer, "ekka-trace");
  if (!sys::fs::can_execute(Tracer))
    return makeError("--reference-model: ekka-trace is not beside ekka-diagnose ('" + Tracer +
                     "')");
  if (Error E = traceOne(O, Tracer, RequestsFile, Low, Out.LowPrecision))
    return E;
  if (!Out.FP32.empty())
    if (Error E = traceOne(O, Tracer, RequestsFile, "fp32", Out.FP32))
      return E;
  raw_fd_ostream Mark(Done, EC);
  return Out;
}

} // namespace ekka
