//===- JSON.cpp -----------------------------------------------------------===//
#include "ekka/Support/JSON.h"
#include "ekka/Support/Error.h"

#include "llvm/ADT/StringSet.h"

#include <algorithm>

using namespace llvm;

namespace ekka {

namespace {

bool isJSONSpace(char C) { return C == ' ' || C == '\t' || C == '\n' || C == '\r'; }

/// The end of the string token that begins at \p Begin (a '"'), past its
/// closing quote; npos if it is not closed.
size_t stringEnd(StringRef Text, size_t Begin) {
  for (size_t I = Begin + 1; I < Text.size(); ++I) {
    if (Text[I] == '\\')
      ++I;
    else if (Text[I] == '"')
      return I + 1;
  }
  return StringRef::npos;
}

/// The end of the value token that begins at \p Begin: the first ',', '}'
/// or ']' outside strings and brackets (the caller refuses a ']'); npos if
/// none. \p MaxDepth is set to how deep the value nests. The token's own
/// syntax is json::parse's to check.
size_t valueEnd(StringRef Text, size_t Begin, unsigned &MaxDepth) {
  unsigned Depth = 0;
  MaxDepth = 0;
  for (size_t I = Begin; I < Text.size(); ++I) {
    char C = Text[I];
    if (C == '"') {
      I = stringEnd(Text, I);
      if (I == StringRef::npos)
        return I;
      --I;
    } else if (C == '[' || C == '{') {
      MaxDepth = std::max(MaxDepth, ++Depth);
    } else if (C == ']' || C == '}') {
      if (!Depth)
        return I;
      --Depth;
    } else if (C == ',' && !Depth) {
      return I;
    }
  }
  return StringRef::npos;
}

} // namespace

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

Error forEachJSONMember(StringRef Text,
                        function_ref<Error(StringRef Key, const json::Value &Value)> Each) {
  size_t I = 0;
  auto SkipSpace = [&] {
    while (I < Text.size() && isJSONSpace(Text[I]))
      ++I;
  };
  auto At = [&](char C) { return I < Text.size() && Text[I] == C; };
  auto Bad = [&](const Twine &Why) { return makeError(Why + " at byte " + Twine(I)); };
  SkipSpace();
  if (!At('{'))
    return Bad("expected an object");
  ++I;
  SkipSpace();
  StringSet<> Keys;
  if (At('}')) {
    ++I;
  } else {
    while (true) {
      SkipSpace();
      if (!At('"'))
        return Bad("expected a member's name");
      size_t KeyEnd = stringEnd(Text, I);
      if (KeyEnd == StringRef::npos)
        return Bad("unterminated string");
      Expected<json::Value> Key = json::parse(Text.slice(I, KeyEnd));
      if (!Key)
        return Key.takeError();
      std::optional<StringRef> Name = Key->getAsString();
      if (!Name)
        return Bad("expected a member's name");
      if (!Keys.insert(*Name).second)
        return Bad("member '" + *Name + "' written twice");
      I = KeyEnd;
      SkipSpace();
      if (!At(':'))
        return Bad("expected ':' after member '" + *Name + "'");
      ++I;
      SkipSpace();
      unsigned Depth;
      size_t End = valueEnd(Text, I, Depth);
      if (End == StringRef::npos)
        return Bad("member '" + *Name + "' is not closed");
      if (Text[End] == ']') { // closes nothing open
        I = End;
        return Bad("expected ',' or '}' after member '" + *Name + "'");
      }
      if (1 + Depth > MaxJSONDepth) // the object is a level too
        return makeError("nested deeper than " + Twine(MaxJSONDepth) + " levels");
      Expected<json::Value> Value = json::parse(Text.slice(I, End));
      if (!Value)
        return Value.takeError();
      if (Error E = Each(*Name, *Value))
        return E;
      I = End;
      if (At('}')) {
        ++I;
        break;
      }
      ++I; // ','
    }
  }
  SkipSpace();
  if (I != Text.size())
    return Bad("text after the object");
  return Error::success();
}

} // namespace ekka
