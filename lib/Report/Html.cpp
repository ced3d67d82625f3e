//===- Html.cpp - A diagnosis as one self-contained HTML page -------------===//
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

} // namespace

/// One self-contained page: the error ratio along the call sequence (log
/// scale SVG), the suspects with their evidence and source.
void writeHtml(raw_ostream &OS, const Diagnosis &D, const SourceLocator &Sources) {
  OS << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Ekka diagnosis</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{background:#f4f4f4;padding:1em}"
        ".suspect{color:#b00}</style></head><body>\n";
  OS << "<h1>" << htmlEscape(verdictName(D.Result)) << "</h1>\n";
  if (!D.Suspects.empty())
    OS << "<p class=\"suspect\">First suspect: <b>" << htmlEscape(componentName(D.Suspects[0].Component))
       << "</b> (" << htmlEscape(D.Suspects[0].Component.ClassQualname) << ")</p>\n";
  if (!D.InputsDifference.empty())
    OS << "<p>" << htmlEscape(D.InputsDifference) << "</p>\n";
  for (const SamplingDeparture &S : D.Sampling)
    OS << "<p class=\"suspect\">Sampling: step " << S.Step << " consumed token " << S.Consumed
       << " where the argmax of " << htmlEscape(S.Logits) << "'s logits of step " << S.Step - 1
       << " is " << S.Argmax << "</p>\n";
  // The curve: log10(R) over the call sequence, threshold dashed.
  const double W = 900, H = 260, Pad = 30;
  auto Y = [&](double R) {
    double L = std::log10(std::max(R, 1e-3));
    double T = std::max(0.0, std::min(1.0, (L + 3) / 12));
    return H - Pad - T * (H - 2 * Pad);
  };
  OS << "<svg id=\"error-ratio\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
     << "\" height=\"" << H << "\"><title>error ratio along the call sequence</title>\n";
  OS << "<line x1=\"" << Pad << "\" x2=\"" << W - Pad << "\" y1=\"" << Y(D.Threshold)
     << "\" y2=\"" << Y(D.Threshold) << "\" stroke=\"#888\" stroke-dasharray=\"4\"/>\n";
  size_t N = D.Curve.size();
  std::string Points;
  for (size_t I = 0; I < N; ++I) {
    if (!D.Curve[I].Ratio)
      continue;
    double X = Pad + (N > 1 ? double(I) / double(N - 1) : 0) * (W - 2 * Pad);
    Points += formatv("{0:f1},{1:f1} ", X, Y(*D.Curve[I].Ratio)).str();
    OS << "<circle cx=\"" << formatv("{0:f1}", X) << "\" cy=\""
       << formatv("{0:f1}", Y(*D.Curve[I].Ratio)) << "\" r=\"2\"><title>"
       << htmlEscape(componentName(D.Curve[I])) << " R=" << ratioText(D.Curve[I].Ratio)
       << "</title></circle>\n";
  }
  OS << "<polyline fill=\"none\" stroke=\"#06c\" points=\"" << Points << "\"/>\n</svg>\n";
  OS << "<p>" << htmlEscape(D.NoiseModel) << "; threshold " << format("%g", D.Threshold) << "</p>\n";
  unsigned Rank = 0;
  for (const Suspect &S : D.Suspects) {
    OS << "<h2>Suspect " << ++Rank << ": " << htmlEscape(componentName(S.Component)) << "</h2>\n<p>"
       << htmlEscape(S.Reason) << "</p>\n<table>";
    for (const ComponentRatio &C : S.Before)
      OS << "<tr><td>" << ratioText(C.Ratio) << "</td><td>" << htmlEscape(componentName(C)) << "</td></tr>";
    OS << "<tr class=\"suspect\"><td>" << ratioText(S.Component.Ratio) << "</td><td><b>"
       << htmlEscape(componentName(S.Component)) << "</b></td></tr>";
    for (const ComponentRatio &C : S.After)
      OS << "<tr><td>" << ratioText(C.Ratio) << "</td><td>" << htmlEscape(componentName(C)) << "</td></tr>";
    OS << "</table>\n";
    SourceLocator::Link L = Sources.classSource(S.Component);
    if (!L.Location.empty())
      OS << "<p>" << htmlEscape(L.Location) << "</p>\n";
    if (S.Op) {
      OS << "<p>op <b>" << htmlEscape(S.Op->Name) << "</b>";
      if (S.Op->Ratio)
        OS << ", R = " << ratioText(S.Op->Ratio);
      OS << " (" << htmlEscape(S.Op->Reason) << ")";
      if (std::string Where = Sources.op(S.Op->Name); !Where.empty())
        OS << ", " << htmlEscape(Where);
      OS << "</p>\n";
      for (size_t I = 0; I < S.Op->Kernels.size(); ++I) {
        SourceLocator::KernelSite Site = Sources.kernel(S.Op->Kernels[I]);
        OS << "<p>kernel <b>" << htmlEscape(Site.Display) << "</b>";
        if (!Site.Where.empty())
          OS << " " << htmlEscape(Site.Where);
        if (int(I) == S.Op->KernelIndex)
          OS << " &larr; " << htmlEscape(S.Op->KernelReason);
        OS << "</p>\n";
      }
    }
    if (!L.Excerpt.empty())
      OS << "<pre>" << htmlEscape(L.Excerpt) << "</pre>\n";
  }
  OS << "</body></html>\n";
}

} // namespace ekka
