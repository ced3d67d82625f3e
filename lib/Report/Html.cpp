//===- Html.cpp - A diagnosis as one self-contained HTML page -------------===//
//
// The page a person opens from `ekka-diagnose --html`: the verdict, the error
// ratio along the call sequence as an SVG with its axes, threshold and
// suspects marked, and per suspect its reason, evidence table and source.
// It loads nothing and runs no script (its Content-Security-Policy forbids
// both), so it opens offline and from an untrusted mailbox alike.
//
//===----------------------------------------------------------------------===//
#include "ekka/Report/Report.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>

using namespace llvm;

namespace ekka {

namespace {

std::string htmlEscape(StringRef S) {
  std::string Out;
  for (char C : S) {
    switch (C) {
    case '<': Out += "&lt;"; break;
    case '>': Out += "&gt;"; break;
    case '&': Out += "&amp;"; break;
    case '"': Out += "&quot;"; break;
    default: Out += C;
    }
  }
  return Out;
}

const char *PageHead =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    // Nothing from anywhere, no script: the page is whole as written.
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
    "style-src 'unsafe-inline'; img-src data:\">"
    "<title>Ekka diagnosis</title><style>"
    "body{font-family:sans-serif;margin:2em;max-width:72em;color:#222}"
    "pre{background:#f4f4f4;padding:1em;overflow-x:auto}"
    ".suspect{color:#b00}.first{font-size:1.1em}"
    "table.evidence{border-collapse:collapse;margin:.5em 0}"
    "table.evidence td,table.evidence th{padding:.15em .8em;text-align:left;"
    "font-family:monospace}"
    "table.evidence thead th{border-bottom:1px solid #888}"
    "tr.suspect td{font-weight:bold;background:#fde8e8}"
    "svg text{font-family:sans-serif;font-size:11px;fill:#444}"
    "svg text.mark{fill:#b00}svg text.rank{fill:#b00;font-weight:bold}"
    "</style></head><body>\n";

/// The curve: log10(R) over the call sequence, from R = 10^-3 to 10^9.
class Plot {
public:
  static constexpr double W = 900, H = 280, Left = 56, Right = 16, Top = 16, Bottom = 40;
  explicit Plot(size_t N) : N(N) {}

  double x(size_t I) const {
    return Left + (N > 1 ? double(I) / double(N - 1) : 0.5) * (W - Left - Right);
  }
  double y(double R) const {
    double L = std::log10(std::max(R, 1e-3));
    double T = std::max(0.0, std::min(1.0, (L + 3) / 12));
    return H - Bottom - T * (H - Top - Bottom);
  }

private:
  size_t N;
};

void writeCurve(raw_ostream &OS, const Diagnosis &D) {
  Plot P(D.Curve.size());
  auto F = [](double V) { return formatv("{0:f1}", V).str(); };
  OS << "<svg id=\"error-ratio\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << Plot::W
     << "\" height=\"" << Plot::H << "\" role=\"img\">"
     << "<title>error ratio R along the call sequence</title>\n";
  // Axes, with R's decades on the left.
  double X0 = Plot::Left, X1 = Plot::W - Plot::Right, YB = Plot::H - Plot::Bottom;
  OS << "<line class=\"axis\" x1=\"" << X0 << "\" x2=\"" << X0 << "\" y1=\"" << Plot::Top
     << "\" y2=\"" << YB << "\" stroke=\"#444\"/>\n"
     << "<line class=\"axis\" x1=\"" << X0 << "\" x2=\"" << X1 << "\" y1=\"" << YB << "\" y2=\""
     << YB << "\" stroke=\"#444\"/>\n";
  for (int Exp = -3; Exp <= 9; Exp += 3) {
    double Y = P.y(std::pow(10.0, Exp));
    OS << "<line x1=\"" << X0 - 4 << "\" x2=\"" << X0 << "\" y1=\"" << F(Y) << "\" y2=\""
       << F(Y) << "\" stroke=\"#444\"/><text class=\"tick\" x=\"" << X0 - 6 << "\" y=\""
       << F(Y + 4) << "\" text-anchor=\"end\">" << (Exp == 0 ? "1" : "1e" + std::to_string(Exp))
       << "</text>\n";
  }
  OS << "<text class=\"axis-label\" x=\"" << F((X0 + X1) / 2) << "\" y=\"" << Plot::H - 8
     << "\" text-anchor=\"middle\">target module calls, in execution order ("
     << D.Curve.size() << ")</text>\n"
     << "<text class=\"axis-label\" transform=\"rotate(-90)\" x=\"" << F(-(Plot::Top + YB) / 2)
     << "\" y=\"14\" text-anchor=\"middle\">R (log scale)</text>\n";
  double YT = P.y(D.Threshold);
  OS << "<line class=\"threshold\" x1=\"" << X0 << "\" x2=\"" << X1 << "\" y1=\"" << F(YT)
     << "\" y2=\"" << F(YT) << "\" stroke=\"#888\" stroke-dasharray=\"4\"/>"
     << "<text class=\"threshold\" x=\"" << X1 << "\" y=\"" << F(YT - 4)
     << "\" text-anchor=\"end\">threshold " << format("%g", D.Threshold) << "</text>\n";

  std::string Points;
  for (size_t I = 0; I < D.Curve.size(); ++I) {
    if (!D.Curve[I].Ratio)
      continue;
    std::string X = F(P.x(I)), Y = F(P.y(*D.Curve[I].Ratio));
    Points += X + "," + Y + " ";
    OS << "<circle cx=\"" << X << "\" cy=\"" << Y << "\" r=\"2\" fill=\"#039\"><title>"
       << htmlEscape(componentName(D.Curve[I])) << " R=" << ratioText(D.Curve[I].Ratio)
       << "</title></circle>\n";
  }
  OS << "<polyline class=\"curve\" fill=\"none\" stroke=\"#06c\" stroke-width=\"1.5\" points=\""
     << Points << "\"/>\n";

  // The suspects, circled and numbered on the curve, with a key.
  unsigned Rank = 0;
  for (const Suspect &S : D.Suspects) {
    ++Rank;
    auto It = llvm::find_if(D.Curve, [&](const ComponentRatio &C) {
      return C.CallId == S.Component.CallId;
    });
    if (It != D.Curve.end() && It->Ratio) {
      size_t I = size_t(It - D.Curve.begin());
      std::string X = F(P.x(I)), Y = F(P.y(*It->Ratio));
      OS << "<circle class=\"suspect-mark\" cx=\"" << X << "\" cy=\"" << Y
         << "\" r=\"7\" fill=\"none\" stroke=\"#b00\" stroke-width=\"2\"/>"
         << "<text class=\"rank\" x=\"" << F(P.x(I) + 9) << "\" y=\"" << F(P.y(*It->Ratio) - 8)
         << "\">" << Rank << "</text>\n";
    }
    OS << "<text class=\"mark\" x=\"" << X0 + 10 << "\" y=\"" << Plot::Top + 14 * Rank << "\">"
       << Rank << ". " << htmlEscape(componentName(S.Component)) << "</text>\n";
  }
  OS << "</svg>\n";
}

void writeEvidenceRow(raw_ostream &OS, const ComponentRatio &C, bool IsSuspect) {
  OS << (IsSuspect ? "<tr class=\"suspect\">" : "<tr>") << "<td>" << ratioText(C.Ratio)
     << "</td><td>" << htmlEscape(componentName(C)) << "</td></tr>\n";
}

void writeSuspect(raw_ostream &OS, const Suspect &S, unsigned Rank,
                  const SourceLocator &Sources) {
  OS << "<section class=\"finding\"><h2>Suspect " << Rank << ": "
     << htmlEscape(componentName(S.Component)) << "</h2>\n<p class=\"reason\">"
     << htmlEscape(S.Reason) << "</p>\n";
  if (!S.Relation.empty())
    OS << "<p class=\"relation\">its output: " << htmlEscape(S.Relation) << "</p>\n";
  OS << "<table class=\"evidence\"><thead><tr><th>R</th><th>module call</th></tr></thead>"
        "<tbody>\n";
  for (const ComponentRatio &C : S.Before)
    writeEvidenceRow(OS, C, false);
  writeEvidenceRow(OS, S.Component, true);
  for (const ComponentRatio &C : S.After)
    writeEvidenceRow(OS, C, false);
  OS << "</tbody></table>\n";
  SourceLocator::Link L = Sources.classSource(S.Component);
  if (!L.Location.empty())
    OS << "<p class=\"where\">defined at " << htmlEscape(L.Location) << "</p>\n";
  if (S.Op) {
    OS << "<p class=\"op\">op <b>" << htmlEscape(S.Op->Name) << "</b>";
    if (S.Op->Ratio)
      OS << ", R = " << ratioText(S.Op->Ratio);
    OS << " (" << htmlEscape(S.Op->Reason) << ")";
    if (std::string Where = Sources.op(S.Op->Name); !Where.empty())
      OS << ", " << htmlEscape(Where);
    OS << "</p>\n";
    for (size_t I = 0; I < S.Op->Kernels.size(); ++I) {
      SourceLocator::KernelSite Site = Sources.kernel(S.Op->Kernels[I]);
      OS << "<p class=\"kernel\">kernel <b>" << htmlEscape(Site.Display) << "</b>";
      if (!Site.Where.empty())
        OS << " " << htmlEscape(Site.Where);
      if (int(I) == S.Op->KernelIndex)
        OS << " &larr; " << htmlEscape(S.Op->KernelReason);
      OS << "</p>\n";
    }
  }
  if (!L.Excerpt.empty())
    OS << "<pre class=\"source\">" << htmlEscape(L.Excerpt) << "</pre>\n";
  OS << "</section>\n";
}

} // namespace

void writeHtml(raw_ostream &OS, const Diagnosis &D, const SourceLocator &Sources) {
  OS << PageHead;
  OS << "<h1>" << htmlEscape(verdictName(D.Result)) << "</h1>\n";
  if (!D.Suspects.empty())
    OS << "<p class=\"first suspect\">First suspect: <b>"
       << htmlEscape(componentName(D.Suspects[0].Component)) << "</b> ("
       << htmlEscape(D.Suspects[0].Component.ClassQualname) << "), R = "
       << ratioText(D.Suspects[0].Component.Ratio) << "</p>\n";
  if (!D.InputsDifference.empty())
    OS << "<p class=\"inputs\">" << htmlEscape(D.InputsDifference) << "</p>\n";
  for (const SamplingDeparture &S : D.Sampling)
    OS << "<p class=\"suspect sampling\">Sampling: step " << S.Step << " consumed token "
       << S.Consumed << " where the argmax of " << htmlEscape(S.Logits) << "'s logits of step "
       << S.Step - 1 << " is " << S.Argmax << "</p>\n";
  writeCurve(OS, D);
  OS << "<p class=\"noise\">" << htmlEscape(D.NoiseModel) << "; threshold "
     << format("%g", D.Threshold) << "</p>\n";
  auto Notes = diagnosisNotes(D);
  if (!Notes.empty()) {
    OS << "<ul class=\"notes\">\n";
    for (const auto &[Label, Note] : Notes)
      OS << "<li>" << htmlEscape(Label) << ": " << htmlEscape(Note) << "</li>\n";
    OS << "</ul>\n";
  }
  unsigned Rank = 0;
  for (const Suspect &S : D.Suspects)
    writeSuspect(OS, S, ++Rank, Sources);
  OS << "</body></html>\n";
}

} // namespace ekka
