//===- JSONTest.cpp -------------------------------------------------------===//
#include "ekka/Support/JSON.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace ekka;
using namespace llvm;

namespace {

/// The members forEachJSONMember gives, "key=value" each, or "error: ...".
std::vector<std::string> members(StringRef Text) {
  std::vector<std::string> Out;
  if (Error E = forEachJSONMember(Text, [&](StringRef Key, const json::Value &V) {
        std::string S;
        raw_string_ostream(S) << Key << "=" << V;
        Out.push_back(S);
        return Error::success();
      }))
    Out = {"error: " + toString(std::move(E))};
  return Out;
}

TEST(JSONMembers, AreGivenInTheOrderWrittenEachParsed) {
  EXPECT_EQ(members(R"( {"b": [1, {"x": "}, ]"}], "a\"}" : {"c": [2,3]} ,"": null}  )"),
            (std::vector<std::string>{R"(b=[1,{"x":"}, ]"}])", R"(a"}={"c":[2,3]})", "=null"}));
  EXPECT_EQ(members("{}"), std::vector<std::string>{});
  EXPECT_EQ(members(" \n{ \t}\r\n"), std::vector<std::string>{});
  EXPECT_EQ(members(R"({"\u00e9\n": "v"})"), (std::vector<std::string>{"\xc3\xa9\n=\"v\""}));
}

// Whatever json::parse refuses as an object, this refuses too (and a key
// written twice, which json::parse keeps once).
TEST(JSONMembers, RefuseWhatIsNotOneObject) {
  for (StringRef Text :
       {"", "[]", "1", R"("a")", "{", "}", R"({"a"})", R"({"a":})", R"({"a":1,})", R"({,})",
        R"({"a":1 "b":2})", R"({"a":1}{})", R"({"a":1} x)", R"({a:1})", R"({"a":[1,2})",
        R"({"a":{"b":1]})", R"({"a":"open})", R"({"a":1]})", R"({"a":1]"b":2})", R"({"a":{"x":1}] "b":2})", R"({"a" 1})",
        R"({"a":tru})", "{\"a\":\"\xff\"}", R"({"a":1}})"}) {
    Expected<json::Value> Whole = json::parse(Text);
    EXPECT_FALSE(Whole && Whole->getAsObject()) << Text.str();
    if (!Whole)
      consumeError(Whole.takeError());
    std::vector<std::string> Got = members(Text);
    ASSERT_EQ(Got.size(), 1u) << Text.str();
    EXPECT_EQ(StringRef(Got[0]).substr(0, 7), "error: ") << Text.str() << " gave " << Got[0];
  }
  EXPECT_EQ(members(R"({"a":1,"a":2})"),
            std::vector<std::string>{"error: member 'a' written twice at byte 7"});
  EXPECT_EQ(members(R"({"a":1]"b":2})"),
            std::vector<std::string>{"error: expected ',' or '}' after member 'a' at byte 6"});
}

// The object counts as a level: what parseJSON refuses as too deep, this
// refuses too, and one level less it takes.
TEST(JSONMembers, CountTheObjectInTheDepth) {
  auto Nested = [](unsigned Levels) {
    return "{\"a\":" + std::string(Levels - 1, '[') + std::string(Levels - 1, ']') + "}";
  };
  for (unsigned Levels : {MaxJSONDepth, MaxJSONDepth + 1}) {
    std::string Text = Nested(Levels);
    Expected<json::Value> Whole = parseJSON(Text);
    EXPECT_EQ(bool(Whole), Levels <= MaxJSONDepth);
    if (!Whole)
      consumeError(Whole.takeError());
    std::vector<std::string> Got = members(Text);
    ASSERT_EQ(Got.size(), 1u);
    EXPECT_EQ(StringRef(Got[0]).starts_with("error: nested deeper"), Levels > MaxJSONDepth)
        << Levels << " levels gave " << Got[0];
  }
}

TEST(JSONMembers, AgreeWithJSONParseOnValidObjects) {
  for (StringRef Text : {R"({"x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})",
                         R"({"__metadata__": {"k": "v,}"}, "y": [[[]]], "z": -1.5e3})"}) {
    Expected<json::Value> Whole = json::parse(Text);
    ASSERT_TRUE(bool(Whole)) << toString(Whole.takeError());
    size_t N = 0;
    ASSERT_FALSE(bool(forEachJSONMember(Text, [&](StringRef Key, const json::Value &V) {
      ++N;
      EXPECT_EQ(*Whole->getAsObject()->get(Key), V) << Key.str();
      return Error::success();
    })));
    EXPECT_EQ(N, Whole->getAsObject()->size());
  }
}

TEST(JSONMembers, StopAtTheFirstErrorOfTheCallee) {
  int Calls = 0;
  Error E = forEachJSONMember(R"({"a":1,"b":2,"c":3})", [&](StringRef Key, const json::Value &) {
    ++Calls;
    return Key == "b" ? createStringError(inconvertibleErrorCode(), "no b") : Error::success();
  });
  EXPECT_EQ(toString(std::move(E)), "no b");
  EXPECT_EQ(Calls, 2);
}

} // namespace
