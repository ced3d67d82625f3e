//===- JSON.cpp -----------------------------------------------------------===//
#include "ekka/Support/JSON.h"
#include "ekka/Support/Error.h"

using namespace llvm;

namespace ekka {

Expected<json::Value> parseJSON(StringRef Text) {
  unsigned Depth = 0;
  bool InString = false;
  for (size_t I = 0; I < Text.size(); ++I) {
    char C = Text[I];
    if (InString) {
      if (C == '\\')
        ++I;
      else if (C == '"')
        InString = false;
    } else if (C == '"') {
      InString = true;
    } else if (C == '[' || C == '{') {
      if (++Depth > MaxJSONDepth)
        return makeError("nested deeper than " + Twine(MaxJSONDepth) + " levels");
    } else if ((C == ']' || C == '}') && Depth) {
      --Depth;
    }
  }
  return json::parse(Text);
}

} // namespace ekka
