//===- PythonOpRegistrations.cpp - Custom ops registered from Python ------===//
//
// Not every custom op a trace names is registered in C++. vLLM registers
// its attention and MoE ops from Python, into its `vllm` library:
//
//   direct_register_custom_op(op_name="unified_attention", op_func=unified_attention,
//                             mutates_args=[...], fake_impl=unified_attention_fake)
//
// and torch.library has its own forms:
//
//   @torch.library.custom_op("mylib::my_add", mutates_args=())
//   def my_add(a, b): ...
//   lib = torch.library.Library("x", "DEF"); lib.define("foo(Tensor a) -> Tensor")
//   lib.impl("foo", foo_cuda, "CUDA")
//   @torch.library.register_fake("mylib::my_add")
//
// Each is recorded as an `op` definition, as TorchOpRegistrations.cpp records
// a TORCH_LIBRARY block's, so find_op answers both alike. Only literal names
// are read: a name built at run time (`lib.define(name + schema)`) is not.
//
//===----------------------------------------------------------------------===//
#include "PythonIndexerInternal.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/Twine.h"

#include <cstring>
#include <optional>

extern "C" const TSLanguage *tree_sitter_python(void);

using namespace llvm;

namespace ekka {

namespace {

/// Symbols and fields of the grammar that registrations are made of.
struct CallGrammar {
  const TSLanguage *Lang = tree_sitter_python();
  TSSymbol Call, KeywordArgument, String, ConcatenatedString, StringContent, Interpolation,
      Assignment, Decorated, Decorator, Lambda, None, Tuple, List;
  TSFieldId Function, Arguments, Name, Value, Left, Right, Definition;

  CallGrammar() {
    auto Sym = [&](const char *N) {
      return ts_language_symbol_for_name(Lang, N, strlen(N), /*named=*/true);
    };
    auto Field = [&](const char *N) { return ts_language_field_id_for_name(Lang, N, strlen(N)); };
    Call = Sym("call");
    KeywordArgument = Sym("keyword_argument");
    String = Sym("string");
    ConcatenatedString = Sym("concatenated_string");
    StringContent = Sym("string_content");
    Interpolation = Sym("interpolation");
    Assignment = Sym("assignment");
    Decorated = Sym("decorated_definition");
    Decorator = Sym("decorator");
    Lambda = Sym("lambda");
    None = Sym("none");
    Tuple = Sym("tuple");
    List = Sym("list");
    Function = Field("function");
    Arguments = Field("arguments");
    Name = Field("name");
    Value = Field("value");
    Left = Field("left");
    Right = Field("right");
    Definition = Field("definition");
  }
};

const CallGrammar &callGrammar() {
  static const CallGrammar G;
  return G;
}

/// The last part of a dotted name: `torch.library.Library` -> `Library`.
StringRef lastPart(StringRef Dotted) { return Dotted.substr(Dotted.rfind('.') + 1); }

/// A call's arguments: positional in order, keywords by name.
struct CallArguments {
  std::vector<TSNode> Positional;
  StringMap<TSNode> Keywords;

  /// The argument given by keyword \p Keyword or else at \p Position.
  std::optional<TSNode> get(StringRef Keyword, size_t Position) const {
    auto It = Keywords.find(Keyword);
    if (It != Keywords.end())
      return It->second;
    if (Position < Positional.size())
      return Positional[Position];
    return std::nullopt;
  }
};

/// A `torch.library.Library("ns", "KIND"[, "KEY"])` bound to a name.
struct LibraryObject {
  std::string Namespace;
  std::string DispatchKey;
};

/// One registration, before it becomes a definition.
struct Registration {
  std::string Namespace, Op; ///< `Op` may carry an overload: `foo.out`.
  std::string Function;      ///< Empty for a schema alone.
  std::string DispatchKey;
  TSNode At;                 ///< The call (or decorator) that registers.
};

class RegistrationFinder {
public:
  RegistrationFinder(StringRef Source, StringRef ModuleName, FileDefinitions &Out)
      : Source(Source), ModuleName(ModuleName), Out(Out), G(callGrammar()) {
    for (const Definition &D : Out.Definitions) {
      if (D.Kind == DefinitionKind::Function)
        Functions.insert(D.QualifiedName);
      if (D.Kind == DefinitionKind::Function || D.Kind == DefinitionKind::Method)
        FunctionsByStart[D.ByteStart] = D.QualifiedName;
    }
    for (const ImportBinding &I : Out.Imports)
      Imports[I.Alias] = I.Target;
    findTriggers();
  }

  void run(TSNode Root) {
    // Walked with a cursor, not recursion: the tree may be deep.
    TSTreeCursor C = ts_tree_cursor_new(Root);
    for (bool Descend = true;;) {
      TSNode N = ts_tree_cursor_current_node(&C);
      if (Descend && mayRegister(N) && visit(N) && ts_tree_cursor_goto_first_child(&C))
        continue;
      if (ts_tree_cursor_goto_next_sibling(&C)) {
        Descend = true;
        continue;
      }
      if (!ts_tree_cursor_goto_parent(&C))
        break;
      Descend = false;
    }
    ts_tree_cursor_delete(&C);
  }

private:
  StringRef text(TSNode N) const {
    return Source.slice(ts_node_start_byte(N), ts_node_end_byte(N));
  }
  unsigned line(TSNode N) const { return ts_node_start_point(N).row + 1; }

  /// Where the source names something a registration is made with: a
  /// registering method (the last part of every callee registration() reads)
  /// or `Library`, under its own name or an import's alias.
  void findTriggers() {
    SmallVector<StringRef, 8> Words = {"custom_op", "register_fake", "register_kernel",
                                       "define",    "impl",          "Library"};
    for (const auto &I : Imports)
      if (lastPart(I.second) == "Library")
        Words.push_back(I.first());
    for (StringRef W : Words)
      for (size_t At = Source.find(W); At != StringRef::npos; At = Source.find(W, At + 1))
        Triggers.push_back(uint32_t(At));
    llvm::sort(Triggers);
  }

  /// Whether \p N holds a trigger, without which nothing in it registers.
  /// Walking every node of a file that passed the substring test was most of
  /// this pass (3.6% of FlashInfer's Python CPU time); skipping halves that.
  bool mayRegister(TSNode N) const {
    auto It = llvm::lower_bound(Triggers, ts_node_start_byte(N));
    return It != Triggers.end() && *It < ts_node_end_byte(N);
  }

  /// Looks at one node; says whether its children are to be visited.
  bool visit(TSNode N) {
    TSSymbol S = ts_node_symbol(N);
    if (S == G.Assignment) {
      recordLibrary(N);
    } else if (S == G.Decorated) {
      // Decorators register the function they decorate.
      TSNode Def = ts_node_child_by_field_id(N, G.Definition);
      std::string Fn = decoratedFunction(N, Def);
      forEachChild(N, [&](TSNode D) {
        if (ts_node_symbol(D) == G.Decorator && ts_node_named_child_count(D))
          registration(ts_node_named_child(D, 0), D, Fn);
      });
      if (!ts_node_is_null(Def))
        run(Def);
      return false;
    } else if (S == G.Call) {
      registration(N, N, "");
    }
    return true;
  }

  /// The qualified name of a decorated function, as the indexer named it.
  std::string decoratedFunction(TSNode Decorated, TSNode Def) const {
    auto It = FunctionsByStart.find(ts_node_start_byte(Decorated));
    if (It != FunctionsByStart.end())
      return It->second;
    TSNode Name = ts_node_is_null(Def) ? Def : ts_node_child_by_field_id(Def, G.Name);
    return ts_node_is_null(Name) ? "" : text(Name).str();
  }

  /// A string literal's value; none for an f-string with replacements or
  /// anything that is not a literal.
  std::optional<std::string> literal(TSNode N) const {
    TSSymbol S = ts_node_symbol(N);
    std::optional<std::string> Value = std::string();
    if (S == G.ConcatenatedString) {
      forEachChild(N, [&](TSNode Part) {
        std::optional<std::string> P = ts_node_is_named(Part) ? literal(Part) : std::string();
        Value = Value && P ? std::optional<std::string>(*Value + *P) : std::nullopt;
      });
      return Value;
    }
    if (S != G.String)
      return std::nullopt;
    forEachChild(N, [&](TSNode Part) {
      TSSymbol PS = ts_node_symbol(Part);
      if (PS == G.Interpolation)
        Value = std::nullopt;
      else if (PS == G.StringContent && Value)
        *Value += text(Part).str();
    });
    return Value;
  }

  /// A dispatch key's value, or the expression as written when it is not
  /// a literal: what it is at run time, a reader can look up. None for
  /// `None`, and for an f-string, whose text would read as a key.
  std::string key(TSNode N) const {
    if (std::optional<std::string> L = literal(N))
      return *L;
    TSSymbol S = ts_node_symbol(N);
    // register_kernel's device_types=("cpu", "cuda"): "cpu,cuda". A comment
    // between them (an extra) is none.
    if (S == G.Tuple || S == G.List) {
      std::optional<std::string> Keys = std::string();
      forEachChild(N, [&](TSNode Part) {
        if (!ts_node_is_named(Part) || ts_node_is_extra(Part) || !Keys)
          return;
        std::optional<std::string> K = literal(Part);
        Keys = K ? std::optional<std::string>(*Keys + (Keys->empty() ? "" : ",") + *K)
                 : std::nullopt;
      });
      if (Keys && !Keys->empty())
        return *Keys;
    }
    if (S == G.None || S == G.String || S == G.ConcatenatedString)
      return "";
    return text(N).str();
  }

  /// A dotted name with its first part replaced by what the module's
  /// imports bind it to: `tl.custom_op` -> `torch.library.custom_op`.
  std::string resolved(StringRef Dotted) const {
    auto [Head, Tail] = Dotted.split('.');
    auto It = Imports.find(Head);
    if (It == Imports.end())
      return Dotted.str();
    return Tail.empty() ? It->second : It->second + "." + Tail.str();
  }

  /// The function an argument names: qualified when this module defines it
  /// or imports it, `(lambda at line N)` for a lambda, else as written.
  std::string function(TSNode N) const {
    if (ts_node_symbol(N) == G.Lambda)
      return ("(lambda at line " + Twine(line(N)) + ")").str();
    StringRef Name = text(N);
    std::string Local = ModuleName.empty() ? Name.str() : (ModuleName + "." + Name).str();
    if (Functions.contains(Local))
      return Local;
    return resolved(Name);
  }

  CallArguments arguments(TSNode Call) const {
    CallArguments A;
    TSNode Args = ts_node_child_by_field_id(Call, G.Arguments);
    if (ts_node_is_null(Args))
      return A;
    forEachChild(Args, [&](TSNode Arg) {
      if (!ts_node_is_named(Arg) || ts_node_is_extra(Arg))
        return;
      if (ts_node_symbol(Arg) != G.KeywordArgument) {
        A.Positional.push_back(Arg);
        return;
      }
      TSNode Key = ts_node_child_by_field_id(Arg, G.Name);
      TSNode Value = ts_node_child_by_field_id(Arg, G.Value);
      if (!ts_node_is_null(Key) && !ts_node_is_null(Value))
        A.Keywords[text(Key)] = Value;
    });
    return A;
  }

  /// lib = torch.library.Library("ns", "DEF" | "FRAGMENT" | "IMPL"[, "KEY"])
  void recordLibrary(TSNode Assignment) {
    TSNode Left = ts_node_child_by_field_id(Assignment, G.Left);
    TSNode Right = ts_node_child_by_field_id(Assignment, G.Right);
    if (ts_node_is_null(Left) || ts_node_is_null(Right) || ts_node_symbol(Right) != G.Call)
      return;
    TSNode Callee = ts_node_child_by_field_id(Right, G.Function);
    if (ts_node_is_null(Callee) || lastPart(resolved(text(Callee))) != "Library")
      return;
    CallArguments A = arguments(Right);
    std::optional<TSNode> Ns = A.get("ns", 0);
    std::optional<std::string> Name = Ns ? literal(*Ns) : std::nullopt;
    if (!Name)
      return;
    LibraryObject L{*Name, ""};
    if (std::optional<TSNode> Key = A.get("dispatch_key", 2))
      L.DispatchKey = key(*Key);
    Libraries[text(Left)] = L;
  }

  /// Splits `ns::op` (a name, or `torch.ops.ns.op` written as an object).
  static std::optional<std::pair<std::string, std::string>> qualifiedOp(StringRef Q) {
    if (Q.contains("::")) {
      auto [Ns, Op] = Q.split("::");
      return std::pair(Ns.str(), Op.str());
    }
    if (Q.consume_front("torch.ops.") && Q.contains('.')) {
      auto [Ns, Op] = Q.split('.');
      return std::pair(Ns.str(), Op.split('.').first.str());
    }
    return std::nullopt;
  }

  std::optional<std::pair<std::string, std::string>> qualifiedOp(std::optional<TSNode> N) const {
    if (!N)
      return std::nullopt;
    if (std::optional<std::string> L = literal(*N))
      return qualifiedOp(*L);
    return qualifiedOp(text(*N));
  }

  struct RegisteringCall;
  /// The registration a call (or a decorator's attribute) makes, if any.
  /// \p Decorated is the function a decorator decorates; \p At is what the
  /// definition spans.
  void registration(TSNode Node, TSNode At, const std::string &Decorated);
  void vllmRegistration(const RegisteringCall &C, Registration &R);
  void torchLibraryRegistration(const RegisteringCall &C, Registration &R);
  void libraryRegistration(const RegisteringCall &C, Registration &R);

  void add(const Registration &R, bool IsDef);

  StringRef Source, ModuleName;
  FileDefinitions &Out;
  const CallGrammar &G;
  StringSet<> Functions; ///< Qualified names of this module's functions.
  /// Every function's qualified name by where its definition (its first
  /// decorator) starts.
  DenseMap<uint64_t, std::string> FunctionsByStart;
  StringMap<std::string> Imports; ///< What the module's imports bind.
  std::vector<uint32_t> Triggers;  ///< Sorted offsets; see findTriggers().
  StringMap<LibraryObject> Libraries;
  /// Functions made ops by `@torch.library.custom_op`, for `@fn.register_fake`.
  StringMap<std::pair<std::string, std::string>> CustomOps;
};

/// What a registering call says, read lazily: most calls register nothing.
struct RegistrationFinder::RegisteringCall {
  const RegistrationFinder &F;
  StringRef Receiver, Method; ///< `lib` and `impl` in `lib.impl(...)`
  StringRef TorchLibrary;     ///< `impl` for `torch.library.impl(...)`
  CallArguments A;
  const std::string &Decorated;

  std::string literal(StringRef Keyword, size_t Position) const {
    std::optional<TSNode> N = A.get(Keyword, Position);
    return N ? F.literal(*N).value_or("") : std::string();
  }
  /// A dispatch key or device types: the literal's value, else the
  /// expression as written (`current_platform.dispatch_key`).
  std::string key(StringRef Keyword, size_t Position) const {
    std::optional<TSNode> N = A.get(Keyword, Position);
    return N ? F.key(*N) : std::string();
  }
  /// The function a decorator decorates, or the one an argument names.
  std::string function(StringRef Keyword, size_t Position) const {
    if (!Decorated.empty())
      return Decorated;
    std::optional<TSNode> N = A.get(Keyword, Position);
    return N && ts_node_symbol(*N) != F.G.None ? F.function(*N) : std::string();
  }
};

void RegistrationFinder::registration(TSNode Node, TSNode At, const std::string &Decorated) {
  bool IsCall = ts_node_symbol(Node) == G.Call;
  TSNode Callee = IsCall ? ts_node_child_by_field_id(Node, G.Function) : Node;
  if (ts_node_is_null(Callee))
    return;
  StringRef Written = text(Callee);
  auto [Receiver, Method] =
      Written.contains('.') ? Written.rsplit('.') : std::pair(StringRef(), Written);
  if (!is_contained({"direct_register_custom_op", "custom_op", "register_fake", "impl_abstract",
                     "register_kernel", "define", "impl", "_register_fake"},
                    Method))
    return;
  std::string API = resolved(Written);
  StringRef TorchLibrary = API;
  if (!TorchLibrary.consume_front("torch.library."))
    TorchLibrary = "";
  RegisteringCall C{*this, Receiver, Method, TorchLibrary,
                    IsCall ? arguments(Node) : CallArguments(), Decorated};
  Registration R;
  R.At = At;
  if (Method == "direct_register_custom_op")
    vllmRegistration(C, R);
  else if (!TorchLibrary.empty())
    torchLibraryRegistration(C, R);
  else
    libraryRegistration(C, R);
}

/// vLLM's direct_register_custom_op(op_name, op_func, mutates_args,
/// fake_impl, target_lib, dispatch_key, tags): into its `vllm` library
/// unless given another.
void RegistrationFinder::vllmRegistration(const RegisteringCall &C, Registration &R) {
  R.Namespace = "vllm";
  if (std::optional<TSNode> Lib = C.A.get("target_lib", 4); Lib && ts_node_symbol(*Lib) != G.None) {
    auto It = Libraries.find(text(*Lib));
    if (It == Libraries.end())
      return; // a library this file does not make
    R.Namespace = It->second.Namespace;
  }
  R.Op = C.literal("op_name", 0);
  R.Function = C.function("op_func", 1);
  R.DispatchKey = C.key("dispatch_key", 5);
  add(R, /*IsDef=*/true);
  R.Function = C.function("fake_impl", 3);
  R.DispatchKey = "Fake";
  if (!R.Function.empty())
    add(R, /*IsDef=*/false);
}

/// torch.library's functions, which name the op `ns::op`:
/// custom_op(name, fn), define(qualname, schema), impl(qualname, types, func),
/// register_kernel(op, device_types, func), register_fake(op, func); and
/// impl(lib, name, dispatch_key, func) on a Library this file made.
void RegistrationFinder::torchLibraryRegistration(const RegisteringCall &C, Registration &R) {
  StringRef API = C.TorchLibrary;
  std::optional<std::pair<std::string, std::string>> Q = qualifiedOp(C.A.get("", 0));
  if (!Q && API == "impl" && !C.A.Positional.empty()) {
    auto It = Libraries.find(text(C.A.Positional.front()));
    if (It == Libraries.end())
      return;
    R.Namespace = It->second.Namespace;
    R.Op = C.literal("name", 1);
    R.DispatchKey = C.key("dispatch_key", 2);
    R.Function = C.function("func", 3);
    add(R, /*IsDef=*/false);
    return;
  }
  if (!Q)
    return;
  std::tie(R.Namespace, R.Op) = *Q;
  if (API == "custom_op") {
    R.Function = C.function("fn", 1);
    if (!C.Decorated.empty())
      CustomOps[lastPart(C.Decorated)] = *Q;
  } else if (API == "register_fake" || API == "impl_abstract") {
    R.Function = C.function("func", 1);
    R.DispatchKey = "Fake";
  } else if (API == "register_kernel" || API == "impl") {
    R.Function = C.function("func", 2);
    R.DispatchKey = C.key("device_types", 1);
  } else if (API != "define") {
    return;
  }
  add(R, /*IsDef=*/API == "custom_op" || API == "define");
}

/// lib.define(schema), lib.impl(op_name, fn, dispatch_key),
/// lib._register_fake(op_name, fn) on a Library this file made, and
/// `@my_add.register_fake` on an op made by @custom_op in this file.
void RegistrationFinder::libraryRegistration(const RegisteringCall &C, Registration &R) {
  if (auto Op = CustomOps.find(C.Receiver); Op != CustomOps.end()) {
    std::tie(R.Namespace, R.Op) = Op->second;
    bool Fake = C.Method == "register_fake";
    if (!Fake && C.Method != "register_kernel")
      return;
    R.Function = C.function("fn", Fake ? 0 : 1);
    R.DispatchKey = Fake ? "Fake" : C.key("device_types", 0);
    add(R, /*IsDef=*/false);
    return;
  }
  auto It = Libraries.find(C.Receiver);
  if (It == Libraries.end())
    return;
  const LibraryObject &Lib = It->second;
  R.Namespace = Lib.Namespace;
  if (C.Method == "define") {
    R.Op = C.literal("schema", 0);
    add(R, /*IsDef=*/true);
  } else if (C.Method == "impl") {
    R.Op = C.literal("op_name", 0);
    R.Function = C.function("fn", 1);
    R.DispatchKey = C.key("dispatch_key", 2);
    if (R.DispatchKey.empty())
      R.DispatchKey = Lib.DispatchKey;
    add(R, /*IsDef=*/false);
  } else if (C.Method == "_register_fake" || C.Method == "register_fake") {
    R.Op = C.literal("op_name", 0);
    R.Function = C.function("fn", 1);
    R.DispatchKey = "Fake";
    add(R, /*IsDef=*/false);
  }
}

void RegistrationFinder::add(const Registration &R, bool IsDef) {
  StringRef Op = StringRef(R.Op).split('(').first.trim();
  Op = Op.split('.').first; // an overload name: `op.out`
  if (R.Namespace.empty() || Op.empty())
    return;
  ekka::Definition D;
  D.Kind = DefinitionKind::Op;
  D.Name = Op.str();
  D.QualifiedName = R.Namespace + "::" + D.Name;
  D.ByteStart = ts_node_start_byte(R.At);
  D.ByteEnd = ts_node_end_byte(R.At);
  D.LineStart = ts_node_start_point(R.At).row + 1;
  D.LineEnd = ts_node_end_point(R.At).row + 1;
  if (!R.Function.empty())
    D.Bases.push_back(R.Function);
  if (!R.DispatchKey.empty())
    D.Decorators.push_back(R.DispatchKey);
  D.IsDeclaration = IsDef && R.Function.empty();
  Out.Definitions.push_back(std::move(D));
}

} // namespace

void findPythonOpRegistrations(TSNode Root, StringRef Source, StringRef ModuleName,
                               FileDefinitions &Out) {
  // Cheap test first: most files register nothing.
  if (!Source.contains("custom_op") && !Source.contains("library") &&
      !Source.contains("Library"))
    return;
  RegistrationFinder(Source, ModuleName, Out).run(Root);
}

} // namespace ekka
