//===- Report.h - A diagnosis as text, JSON and HTML -------------*- C++ -*-===//
//
// What ekka-diagnose prints: terminal text whose first line is the answer,
// JSON for scripts (docs/Diagnose.md lists its keys, a contract), one
// self-contained HTML page with the error ratio along the call sequence as
// an SVG plot, the component mapping (--show-mapping) and the calibration
// file of a known-good pair (--calibrate). Sources come from the code
// indexes given with --index, else from the trace's own file:line.
//
//===----------------------------------------------------------------------===//
#ifndef EKKA_REPORT_REPORT_H
#define EKKA_REPORT_REPORT_H

#include "ekka/Analysis/Diagnosis.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <optional>
#include <string>

namespace ekka {

class CodeIndex;

/// Looks components, ops and kernels up in the code indexes, first index
/// first. An index that fails a query is skipped.
class SourceLocator {
public:
  explicit SourceLocator(llvm::ArrayRef<CodeIndex *> Indexes = {}) : Indexes(Indexes) {}

  struct Link {
    std::string Location; ///< file:line, or empty
    std::string Excerpt;  ///< the definition's source, when indexed
  };
  /// A component's class definition (get_class_definition), else the
  /// trace's file:line.
  Link classSource(const ComponentRatio &C) const;

  struct KernelSite {
    std::string Where;   ///< file:line, or empty
    std::string Display; ///< the index's name, else the demangled one
  };
  /// A GPU kernel (find_kernel). A CUPTI name is mangled, with nvcc's
  /// per-file name for an anonymous namespace; the index knows it readably.
  KernelSite kernel(llvm::StringRef Name) const;

  /// Where a custom op is implemented (find_op): the implementing function
  /// if known, else its registration; empty when no index knows it.
  std::string op(llvm::StringRef Name) const;

  bool empty() const { return Indexes.empty(); }

private:
  llvm::ArrayRef<CodeIndex *> Indexes;
};

/// A component as reports name it: its path, or "(root Class)".
std::string componentName(const ComponentRatio &C);

/// A ratio in three significant digits, "-" when not compared.
std::string ratioText(const std::optional<double> &R);

/// The diagnosis's notes on components above the threshold that are not
/// suspects, each with its label ("rescaled", "few values", "noisier by
/// design"), in the order every report gives them.
std::vector<std::pair<llvm::StringRef, llvm::StringRef>> diagnosisNotes(const Diagnosis &D);

/// The terminal report; its first line is the verdict and the answer.
void printText(llvm::raw_ostream &OS, const Diagnosis &D, const SourceLocator &Sources);

/// The JSON report: `verdict`, `suspects` (each with `component`, `class`,
/// `ratio`, `source`, `kernel`, `evidence`), the curve as `components`
/// (each with what --show-mapping says of it: `mapped`, `reference`,
/// `mapped_by`, `unmapped_reason`).
llvm::json::Value toJSON(const Diagnosis &D, const SourceLocator &Sources);

/// One self-contained HTML page: verdict, the error-ratio curve as an SVG
/// plot, the suspects with evidence and source excerpts.
void writeHtml(llvm::raw_ostream &OS, const Diagnosis &D, const SourceLocator &Sources);

/// --show-mapping: every target call, mapped (to what, by which rule and
/// transform) or unmapped with the reason.
void printMapping(llvm::raw_ostream &OS, const Diagnosis &D);

/// Where a calibration came from, written into its file.
struct CalibrationOrigin {
  std::string Target, Reference, ReferenceFP32;
};

/// Why \p D cannot calibrate (it diverges, or its inputs differ); empty
/// when it is a known-good pair.
std::string calibrationRefusal(const Diagnosis &D);

/// The mapping file --calibrate writes: the validated mappings of \p D,
/// which --mapping reads back.
llvm::json::Value calibrationJSON(const Diagnosis &D, const CalibrationOrigin &Origin,
                                  unsigned *Mappings = nullptr);

} // namespace ekka

#endif
