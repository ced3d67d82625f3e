//===- PythonBinding.cpp - The shim's module calls, from Python directly --===//
//
// The Python module `ekka_runtime_python`: enter() and exit() as the shim's
// hooks call them at every module call, with the arguments of the ops
// torch.ops.ekka.enter and exit, to the same runtime functions. Through the
// dispatcher, a call's strings and tensor lists become IValues and back:
// about 6 us more per module call, which on a launch-bound GPU forward is
// the program's own time. Built only where Python's headers were found; the
// shim falls back to the ops otherwise. As through the dispatcher, the
// runtime runs without the GIL.
//
//===----------------------------------------------------------------------===//
#include "ekka/Runtime/TraceSession.h"

#include <ATen/FuncTorchTLS.h>
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <exception>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace {

/// A str's UTF-8 text, which the str keeps (no copy): valid while the
/// caller holds its argument.
bool stringOf(PyObject *Object, std::string_view &Out) {
  Py_ssize_t Size = 0;
  const char *Text = PyUnicode_AsUTF8AndSize(Object, &Size);
  if (!Text)
    return false;
  Out = std::string_view(Text, size_t(Size));
  return true;
}

bool integerOf(PyObject *Object, int64_t &Out) {
  long long Value = PyLong_AsLongLong(Object);
  if (Value == -1 && PyErr_Occurred())
    return false;
  Out = Value;
  return true;
}

/// The tensors of a list or tuple of them.
bool tensorsOf(PyObject *Sequence, std::vector<at::Tensor> &Out) {
  PyObject *Items = PySequence_Fast(Sequence, "ekka_runtime_python: expected a list of tensors");
  if (!Items)
    return false;
  Py_ssize_t Size = PySequence_Fast_GET_SIZE(Items);
  PyObject **Item = PySequence_Fast_ITEMS(Items);
  bool Ok = true;
  try {
    Out.reserve(size_t(Size));
    for (Py_ssize_t I = 0; I < Size && Ok; ++I) {
      if (THPVariable_Check(Item[I]))
        Out.push_back(THPVariable_Unpack(Item[I]));
      else {
        PyErr_Format(PyExc_TypeError, "ekka_runtime_python: expected a tensor, got %s",
                     Py_TYPE(Item[I])->tp_name);
        Ok = false;
      }
    }
  } catch (const std::exception &E) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_RuntimeError, E.what());
    Ok = false;
  }
  Py_DECREF(Items);
  return Ok;
}

bool arity(const char *Name, Py_ssize_t Got, Py_ssize_t Want) {
  if (Got == Want)
    return true;
  PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", Name, Want, Got);
  return false;
}

/// After the runtime ran: whether it leaves an exception of the program's
/// to raise. Python code that the runtime ran through PyTorch, reading a
/// tensor (a jagged tensor's __torch_dispatch__), may have raised; PyTorch
/// carried it out as a C++ error, which the runtime swallowed, and it is
/// still set on this thread. One that stops the program (KeyboardInterrupt,
/// SystemExit: no Exception) is the program's, left set. Any other is the
/// runtime's loss (a record without that tensor), said once and cleared.
bool interrupted() {
  if (!PyErr_Occurred())
    return false;
  if (!PyErr_ExceptionMatches(PyExc_Exception))
    return true;
  static bool Said = false;
  if (Said) {
    PyErr_Clear();
    return false;
  }
  Said = true;
  PyObject *Type, *Value, *Traceback;
  PyErr_Fetch(&Type, &Value, &Traceback); // cleared
  PyErr_NormalizeException(&Type, &Value, &Traceback);
  PyObject *Text = Value ? PyObject_Str(Value) : nullptr;
  const char *Message = Text ? PyUnicode_AsUTF8(Text) : nullptr;
  PyErr_Clear(); // what asking for the text may have raised
  PySys_FormatStderr("ekka-trace: warning: a module call's tensor was not recorded: reading "
                     "it ran the program's Python, which raised %s: %s\n",
                     Type ? ((PyTypeObject *)Type)->tp_name : "an exception",
                     Message ? Message : "");
  Py_XDECREF(Text);
  Py_XDECREF(Type);
  Py_XDECREF(Value);
  Py_XDECREF(Traceback);
  return false;
}

/// Opens a module call: the runtime's entry with the binding's arguments,
/// `Tensors` a list or tuple of tensors. Null with an exception set, or the
/// call id (0: not recorded).
PyObject *enterWith(PyObject *PathObject, PyObject *ClassNameObject, PyObject *QualnameObject,
                    PyObject *FileObject, PyObject *LineObject, bool IsRoot, PyObject *Tensors) {
  std::string_view Path, ClassName, Qualname, File;
  int64_t Line = 0;
  std::vector<at::Tensor> Inputs;
  if (!stringOf(PathObject, Path) || !stringOf(ClassNameObject, ClassName) ||
      !stringOf(QualnameObject, Qualname) || !stringOf(FileObject, File) ||
      !integerOf(LineObject, Line) || !tensorsOf(Tensors, Inputs))
    return nullptr;
  int64_t Id;
  Py_BEGIN_ALLOW_THREADS
  Id = ekka::enterModuleNoThrow(Path, ClassName, Qualname, File, Line, IsRoot, Inputs);
  Py_END_ALLOW_THREADS
  if (interrupted()) {
    // The shim will not know the call: closed now, as a call that raised.
    PyObject *Type, *Value, *Traceback;
    PyErr_Fetch(&Type, &Value, &Traceback);
    const std::vector<at::Tensor> Nothing;
    Py_BEGIN_ALLOW_THREADS
    ekka::exitModuleNoThrow(Id, Nothing, Nothing, 0);
    Py_END_ALLOW_THREADS
    PyErr_Restore(Type, Value, Traceback);
    return nullptr;
  }
  return PyLong_FromLongLong(Id);
}

/// Closes one: the runtime's exit with the binding's arguments. False with
/// an exception set.
bool exitWith(PyObject *IdObject, PyObject *OutputsObject, PyObject *KeywordObject,
              PyObject *FirstKeywordObject) {
  int64_t Id = 0, FirstKeyword = 0;
  std::vector<at::Tensor> Outputs, KeywordInputs;
  if (!integerOf(IdObject, Id) || !tensorsOf(OutputsObject, Outputs) ||
      !tensorsOf(KeywordObject, KeywordInputs) || !integerOf(FirstKeywordObject, FirstKeyword))
    return false;
  Py_BEGIN_ALLOW_THREADS
  ekka::exitModuleNoThrow(Id, Outputs, KeywordInputs, FirstKeyword);
  Py_END_ALLOW_THREADS
  return !interrupted();
}

/// enter(path, class_name, class_qualname, source_file, source_line,
/// is_root, inputs) -> call id (0: not recorded)
PyObject *enter(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  if (!arity("enter", N, 7))
    return nullptr;
  int IsRoot = PyObject_IsTrue(Args[5]);
  if (IsRoot < 0)
    return nullptr;
  return enterWith(Args[0], Args[1], Args[2], Args[3], Args[4], IsRoot != 0, Args[6]);
}

/// exit(call id, outputs, keyword_inputs, first_keyword_index) -> None
PyObject *exit(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  if (!arity("exit", N, 4) || !exitWith(Args[0], Args[1], Args[2], Args[3]))
    return nullptr;
  Py_RETURN_NONE;
}

/// What tensors() needs of the shim: torch.Tensor and torch.nn.Parameter
/// (tested first, by exact type), its `_opaque(leaf, outputs)` and
/// `_tensors_of_any(value, outputs)`, for what is not a tensor, a scalar, a
/// tuple, list or dict, `_tensors_py` itself (for what is nested deeper
/// than MaxDepth), and the scalar types `(int, float, str)` (isinstance of
/// them also takes an object whose `__class__` says so). Set once by
/// set_tensor_helpers.
PyObject *TensorType, *ParameterType, *OpaqueFn, *OfAnyFn, *PythonFn, *ScalarTypes;
constexpr int HelperCount = 6;

/// Deeper than this the walk is Python's own (_tensors_py): its recursion
/// limit, whatever the program set it to, decides where a list that holds
/// itself raises RecursionError, and the C stack stays shallow. Under the
/// GIL.
constexpr int MaxDepth = 100;
int Depth = 0;

PyObject *callHelper(PyObject *Fn, PyObject *Value, bool Outputs) {
  PyObject *Args[] = {Value, Outputs ? Py_True : Py_False};
  return PyObject_Vectorcall(Fn, Args, 2, nullptr);
}

PyObject *listOf(PyObject *Item) {
  PyObject *List = PyList_New(1);
  if (List) {
    Py_INCREF(Item);
    PyList_SET_ITEM(List, 0, Item);
  }
  return List;
}

bool isScalar(PyTypeObject *Kind) {
  return Kind == Py_TYPE(Py_None) || Kind == &PyBool_Type || Kind == &PyLong_Type ||
         Kind == &PyFloat_Type || Kind == &PyUnicode_Type;
}

PyObject *tensorsOf(PyObject *Value, bool Outputs);

/// tensorsOf one level down; past MaxDepth, _tensors_py's.
PyObject *tensorsWithin(PyObject *Value, bool Outputs) {
  if (Depth >= MaxDepth)
    return callHelper(PythonFn, Value, Outputs);
  ++Depth;
  PyObject *Out = tensorsOf(Value, Outputs);
  --Depth;
  return Out;
}

/// The shim's `_tensors_py` (trace.py), which says what this does, in C: a
/// new list, or null with an exception set.
PyObject *tensorsOf(PyObject *Value, bool Outputs) {
  PyTypeObject *Kind = Py_TYPE(Value);
  if ((PyObject *)Kind == TensorType || (PyObject *)Kind == ParameterType)
    return listOf(Value);
  if (Kind == &PyTuple_Type || Kind == &PyList_Type) {
    PyObject *Out = PyList_New(0);
    if (!Out)
      return nullptr;
    // By index, as Python's loop: a helper's code may change a list.
    for (Py_ssize_t I = 0; I < PySequence_Fast_GET_SIZE(Value); ++I) {
      PyObject *Leaf = PySequence_Fast_GET_ITEM(Value, I);
      Py_INCREF(Leaf);
      PyTypeObject *LeafKind = Py_TYPE(Leaf);
      int Done = 0; // 1: appended or skipped; -1: error; 2: the whole value through pytree
      if (isScalar(LeafKind)) {
        Done = 1;
      } else {
        // -1: an error (isinstance's own code raised).
        int IsTensor = (PyObject *)LeafKind == TensorType ||
                               (PyObject *)LeafKind == ParameterType
                           ? 1
                           : PyObject_IsInstance(Leaf, TensorType);
        if (IsTensor < 0) {
          Done = -1;
        } else if (IsTensor) {
          Done = PyList_Append(Out, Leaf) < 0 ? -1 : 1;
        } else if (LeafKind == &PyTuple_Type || LeafKind == &PyList_Type ||
                   LeafKind == &PyDict_Type) {
          PyObject *Inner = tensorsWithin(Leaf, Outputs);
          Done = !Inner ? -1 : 1;
          if (Inner) {
            Py_ssize_t End = PyList_GET_SIZE(Out);
            if (PyList_SetSlice(Out, End, End, Inner) < 0)
              Done = -1;
            Py_DECREF(Inner);
          }
        } else {
          // A subclass of a scalar type (an IntEnum), or what says it is one.
          int Scalar = PyObject_IsInstance(Leaf, ScalarTypes);
          if (Scalar < 0) {
            Done = -1;
          } else if (Scalar) {
            Done = 1;
          } else {
            PyObject *Opaque = callHelper(OpaqueFn, Leaf, Outputs);
            int Truth = Opaque ? PyObject_IsTrue(Opaque) : -1;
            Py_XDECREF(Opaque);
            Done = Truth < 0 ? -1 : Truth ? 1 : 2;
          }
        }
      }
      Py_DECREF(Leaf);
      if (Done != 1) {
        Py_DECREF(Out);
        return Done < 0 ? nullptr : callHelper(OfAnyFn, Value, Outputs);
      }
    }
    return Out;
  }
  if (Kind == &PyDict_Type) {
    PyObject *Values = PyDict_Values(Value);
    if (!Values)
      return nullptr;
    PyObject *Out = tensorsWithin(Values, Outputs);
    Py_DECREF(Values);
    return Out;
  }
  int IsTensor = PyObject_IsInstance(Value, TensorType);
  if (IsTensor < 0)
    return nullptr;
  return IsTensor ? listOf(Value) : callHelper(OfAnyFn, Value, Outputs);
}

/// tensors(value, outputs=False) -> list
PyObject *tensors(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  if (N != 1 && N != 2) {
    PyErr_Format(PyExc_TypeError, "tensors() takes 1 or 2 arguments (%zd given)", N);
    return nullptr;
  }
  if (!TensorType) {
    PyErr_SetString(PyExc_RuntimeError, "tensors(): set_tensor_helpers was not called");
    return nullptr;
  }
  int Outputs = N == 2 ? PyObject_IsTrue(Args[1]) : 0;
  if (Outputs < 0)
    return nullptr;
  return tensorsOf(Args[0], Outputs != 0);
}

/// Each of \p Slots holds its value of \p Values from now on (a new
/// reference; the one it held is released).
template <size_t N> void keep(PyObject **const (&Slots)[N], PyObject *const *Values) {
  for (size_t I = 0; I < N; ++I) {
    Py_INCREF(Values[I]);
    Py_XSETREF(*Slots[I], Values[I]);
  }
}

/// Each of \p Names, unless made already, the interned str of its text in
/// \p Texts; false with an exception set where one could not be made.
template <size_t N>
bool intern(PyObject **const (&Names)[N], const char *const (&Texts)[N]) {
  for (size_t I = 0; I < N; ++I)
    if (!*Names[I] && !(*Names[I] = PyUnicode_InternFromString(Texts[I])))
      return false;
  return true;
}

/// set_tensor_helpers(tensor_type, parameter_type, opaque, tensors_of_any,
/// tensors_py, scalar_types)
PyObject *setTensorHelpers(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  if (!arity("set_tensor_helpers", N, HelperCount))
    return nullptr;
  PyObject **const Slots[] = {&TensorType, &ParameterType, &OpaqueFn,
                              &OfAnyFn,    &PythonFn,      &ScalarTypes};
  static_assert(std::size(Slots) == HelperCount);
  keep(Slots, Args);
  Py_RETURN_NONE;
}

/// An owned reference, released at the end of its scope.
class Ref {
public:
  explicit Ref(PyObject *Object = nullptr) : Object(Object) {}
  Ref(const Ref &) = delete;
  Ref &operator=(const Ref &) = delete;
  ~Ref() { Py_XDECREF(Object); }
  void reset(PyObject *Other) { Py_XSETREF(Object, Other); }
  PyObject *get() const { return Object; }
  explicit operator bool() const { return Object != nullptr; }

private:
  PyObject *Object;
};

/// A borrowed reference made owned.
PyObject *owned(PyObject *Object) {
  Py_INCREF(Object);
  return Object;
}

/// What the hooks' common case reads of the shim, set once by set_hooks:
/// its `_State`'s attributes (its `__dict__`), its `sources` (a class's
/// qualname, file and line) and `local` (the threads' call stacks),
/// and torch._C._functorch.maybe_current_level. The names of the
/// attributes read.
PyObject *StateDict, *Sources, *Local, *FunctorchLevel;
PyObject *ActiveName, *StartedName, *StackName, *NamesName, *NameName, *ModulesName;

/// The shim's _traced_otherwise(): torch.jit's tracer, or a torch.func
/// transform, at work: 1, 0, or -1 with an exception set. Its third
/// question, torch.jit.is_scripting(), is False in any code that runs as
/// Python. A thread without functorch's state has no transform on it;
/// one with is asked through Python (the header of functorch's layer
/// stack needs one that torch does not ship).
int tracedOtherwise() {
  if (torch::jit::tracer::isTracing())
    return 1;
  if (!at::functorch::functorchTLSAccessor())
    return 0;
  Ref Level(PyObject_CallNoArgs(FunctorchLevel));
  return Level ? Level.get() != Py_None : -1;
}

/// traced_otherwise() -> bool: the shim's _traced_otherwise.
PyObject *tracedOtherwisePy(PyObject *, PyObject *) {
  if (!FunctorchLevel) {
    PyErr_SetString(PyExc_RuntimeError, "traced_otherwise(): set_hooks was not called");
    return nullptr;
  }
  int Traced = tracedOtherwise();
  return Traced < 0 ? nullptr : owned(Traced ? Py_True : Py_False);
}

/// A `_State` attribute's truth: 1, 0, or -1 with an exception set.
int stateFlag(PyObject *Name) {
  PyObject *Value = PyDict_GetItemWithError(StateDict, Name);
  if (!Value && !PyErr_Occurred())
    PyErr_Format(PyExc_AttributeError, "ekka_runtime_python: the shim's state has no %U", Name);
  return Value ? PyObject_IsTrue(Value) : -1;
}

/// This thread's call stack, the shim's `state.local.stack`: a new
/// reference, or null, without an exception where the thread has none yet.
PyObject *threadStack() {
  PyObject *Stack = PyObject_GetAttr(Local, StackName);
  if (!Stack && PyErr_ExceptionMatches(PyExc_AttributeError))
    PyErr_Clear();
  return Stack;
}

/// Whether set_hooks and set_tensor_helpers were called; if not, an error
/// naming \p Function is set.
bool hooksSet(const char *Function) {
  if (StateDict && TensorType)
    return true;
  PyErr_Format(PyExc_RuntimeError, "%s(): set_hooks or set_tensor_helpers not called", Function);
  return false;
}

/// A stack entry as the shim makes them: (module, call id, positional
/// inputs, keyword arguments seen, tree, direct-call marker, path).
bool isEntry(PyObject *Entry) {
  return PyTuple_CheckExact(Entry) && PyTuple_GET_SIZE(Entry) == 7;
}

/// The object \p WeakRef refers to, a new reference, or null where it died.
PyObject *ownerOf(PyObject *WeakRef) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject *Object = nullptr;
  if (PyWeakref_GetRef(WeakRef, &Object) < 0)
    PyErr_Clear();
  return Object;
#else
  PyObject *Object = PyWeakref_GET_OBJECT(WeakRef);
  return Object == Py_None ? nullptr : owned(Object);
#endif
}

/// The shim's `_Tree.still_named` for a module of one path: whether
/// \p Module is still the attribute its name in \p Names says, and each
/// owner up to \p Parent (or the root) too: 1, 0 (`_before` is to be asked:
/// it renames the tree), or -1 with an exception set.
int stillNamed(PyObject *Names, PyObject *Module, PyObject *Name, PyObject *Parent) {
  Ref HeldModule(owned(Module));
  for (;;) {
    if (!PyTuple_CheckExact(Name) || PyTuple_GET_SIZE(Name) != 3)
      return 0;
    Ref HeldName(owned(Name));
    PyObject *OwnerRef = PyTuple_GET_ITEM(Name, 1);
    if (OwnerRef == Py_None)
      return 1;
    if (!PyWeakref_CheckRefExact(OwnerRef))
      return 0;
    Ref Held(ownerOf(OwnerRef));
    PyObject *Owner = Held.get();
    if (!Owner)
      return 0;
    Ref Modules(PyObject_GetAttr(Owner, ModulesName));
    if (!Modules) {
      PyErr_Clear();
      return 0;
    }
    // A dict, or a subclass (an OrderedDict some modules still keep):
    // anything else is asked of the shim, which renames the tree.
    if (!PyDict_Check(Modules.get()))
      return 0;
    PyObject *Slot = PyDict_GetItemWithError(Modules.get(), PyTuple_GET_ITEM(Name, 2));
    if (Slot != Module)
      return PyErr_Occurred() ? -1 : 0;
    if (Owner == Parent)
      return 1;
    Ref Key(PyLong_FromVoidPtr(Owner));
    if (!Key)
      return -1;
    Name = PyDict_GetItemWithError(Names, Key.get());
    if (!Name)
      return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(Name))
      return 1; // several paths: not followed up, as the shim's
    HeldModule.reset(owned(Owner));
    Module = Owner;
  }
}

/// before(module, args, kwargs=None) -> bool: the shim's `_before` for its
/// common case, a module of the tree whose call is open on this thread
/// (every call of a forward but its root's), without running Python. True
/// where it did what `_before` would (recorded the call, or nothing to do);
/// False where `_before` is to be asked: a root, a module outside the
/// tree, a class not seen yet, a forward called directly, no trace yet.
PyObject *before(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  if (N != 2 && N != 3) {
    PyErr_Format(PyExc_TypeError, "before() takes 2 or 3 arguments (%zd given)", N);
    return nullptr;
  }
  if (!hooksSet("before"))
    return nullptr;
  PyObject *Module = Args[0], *Keywords = N == 3 ? Args[2] : Py_None;
  int Active = stateFlag(ActiveName);
  int Traced = Active > 0 ? tracedOtherwise() : 0;
  if (Active <= 0 || Traced)
    return Active < 0 || Traced < 0 ? nullptr : owned(Py_True);
  int Started = stateFlag(StartedName);
  if (Started <= 0)
    return Started < 0 ? nullptr : owned(Py_False);
  Ref Stack(threadStack());
  if (!Stack)
    return PyErr_Occurred() ? nullptr : owned(Py_False);
  if (!PyList_CheckExact(Stack.get()) || PyList_GET_SIZE(Stack.get()) == 0)
    return owned(Py_False);
  PyObject *Outer = PyList_GET_ITEM(Stack.get(), 0);
  if (!isEntry(Outer) || PyTuple_GET_ITEM(Outer, 5) != Py_None ||
      PyTuple_GET_ITEM(Outer, 4) == Py_None)
    return owned(Py_False);
  // The module's own call open around it, or an OptimizedModule's (whose
  // class alone Sources never holds): a compiled call that may be running
  // the call it compiled. _before decides.
  PyObject *Top = PyList_GET_ITEM(Stack.get(), PyList_GET_SIZE(Stack.get()) - 1);
  if (!isEntry(Top) || PyTuple_GET_ITEM(Top, 0) == Module)
    return owned(Py_False);
  Ref Parent(owned(PyTuple_GET_ITEM(Top, 0)));
  if (!PyDict_GetItemWithError(Sources, (PyObject *)Py_TYPE(PyTuple_GET_ITEM(Top, 0))))
    return PyErr_Occurred() ? nullptr : owned(Py_False);
  // Held: finding the tensors may run Python (pytree), which may change the
  // stack or the tree.
  Ref Tree(owned(PyTuple_GET_ITEM(Outer, 4)));
  Ref Names(PyObject_GetAttr(Tree.get(), NamesName));
  Ref Key(Names ? PyLong_FromVoidPtr(Module) : nullptr);
  if (!Key)
    return nullptr;
  if (!PyDict_CheckExact(Names.get()))
    return owned(Py_False);
  // A module still where it was named; one of several paths (vLLM's one
  // rotary embedding of every layer, a router its MoE runner calls) is
  // _before's to choose, from the calls open around it.
  PyObject *Name = PyDict_GetItemWithError(Names.get(), Key.get());
  if (!Name)
    return PyErr_Occurred() ? nullptr : owned(Py_False);
  if (PyList_CheckExact(Name))
    return owned(Py_False);
  Ref AllNames(owned(Name));
  if (!PyTuple_CheckExact(Name) || PyTuple_GET_SIZE(Name) != 3 ||
      !PyUnicode_CheckExact(PyTuple_GET_ITEM(Name, 0)))
    return owned(Py_False);
  Ref NameRef(owned(Name));
  int Named = stillNamed(Names.get(), Module, Name, Parent.get());
  if (Named <= 0)
    return Named < 0 ? nullptr : owned(Py_False);
  PyObject *Path = PyTuple_GET_ITEM(Name, 0);
  // (qualname, file, line), as _class_source keeps them; the name, as
  // _before, asked anew.
  PyObject *Source = PyDict_GetItemWithError(Sources, (PyObject *)Py_TYPE(Module));
  if (!Source)
    return PyErr_Occurred() ? nullptr : owned(Py_False);
  if (!PyTuple_CheckExact(Source) || PyTuple_GET_SIZE(Source) != 3)
    return owned(Py_False);
  Ref SourceRef(owned(Source));
  Ref ClassName(PyObject_GetAttr((PyObject *)Py_TYPE(Module), NameName));
  if (!ClassName)
    return nullptr;
  Ref Inputs(tensorsOf(Args[1], false));
  if (!Inputs)
    return nullptr;
  if (Keywords != Py_None) {
    int Any = PyObject_IsTrue(Keywords);
    if (Any < 0)
      return nullptr;
    if (Any) {
      Ref More(tensorsOf(Keywords, false));
      if (!More)
        return nullptr;
      Inputs.reset(PySequence_InPlaceConcat(Inputs.get(), More.get()));
      if (!Inputs)
        return nullptr;
    }
  }
  Py_ssize_t Count = PyObject_Length(Inputs.get());
  if (Count < 0)
    return nullptr;
  Ref Id(enterWith(Path, ClassName.get(), PyTuple_GET_ITEM(Source, 0),
                   PyTuple_GET_ITEM(Source, 1), PyTuple_GET_ITEM(Source, 2), false,
                   Inputs.get()));
  if (!Id)
    return nullptr;
  Ref CountObject(PyLong_FromSsize_t(Count));
  Ref Entry(CountObject ? PyTuple_Pack(7, Module, Id.get(), CountObject.get(),
                                       Keywords != Py_None ? Py_True : Py_False, Tree.get(),
                                       Py_None, Path)
                        : nullptr);
  if (!Entry || PyList_Append(Stack.get(), Entry.get()) < 0)
    return nullptr;
  return owned(Py_True);
}

/// after(module, args, kwargs, output) or, for a forward that raised,
/// after(module, args, output) -> bool: the shim's `_after` where the call
/// that ends is the last one open on this thread. False where `_after` is
/// to be asked (another is: calls that raised are to be unwound).
PyObject *after(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  if (N != 3 && N != 4) {
    PyErr_Format(PyExc_TypeError, "after() takes 3 or 4 arguments (%zd given)", N);
    return nullptr;
  }
  if (!hooksSet("after"))
    return nullptr;
  // As _after: a forward that raised passes no keyword arguments and its
  // output is None.
  PyObject *Module = Args[0], *Keywords = N == 4 ? Args[2] : nullptr;
  PyObject *Output = N == 4 ? Args[3] : Py_None;
  Ref Stack(threadStack());
  if (!Stack)
    return PyErr_Occurred() ? nullptr : owned(Py_True);
  if (!PyList_CheckExact(Stack.get()))
    return owned(Py_False);
  int Traced = PyList_GET_SIZE(Stack.get()) ? tracedOtherwise() : 0;
  // Read after the question, which may run Python.
  Py_ssize_t Size = PyList_GET_SIZE(Stack.get());
  if (Size == 0 || Traced)
    return Traced < 0 ? nullptr : owned(Py_True);
  PyObject *Top = PyList_GET_ITEM(Stack.get(), Size - 1);
  if (!isEntry(Top) || PyTuple_GET_ITEM(Top, 0) != Module)
    return owned(Py_False);
  Ref Entry(owned(Top));
  if (PyList_SetSlice(Stack.get(), Size - 1, Size, nullptr) < 0)
    return nullptr;
  Ref Outputs(tensorsOf(Output, true));
  int Any = Outputs && Keywords ? PyObject_IsTrue(Keywords) : 0;
  int Seen = Any > 0 ? PyObject_IsTrue(PyTuple_GET_ITEM(Entry.get(), 3)) : 1;
  Ref KeywordInputs(Outputs && Any >= 0 && Seen >= 0
                        ? (Any && !Seen ? tensorsOf(Keywords, false) : PyList_New(0))
                        : nullptr);
  if (!KeywordInputs) {
    // As _after: outputs it cannot walk (a list that holds itself) end the
    // call without them, so that what its caller does next is not its; the
    // error is then the hook's to say.
    PyObject *Type, *Value, *Traceback;
    PyErr_Fetch(&Type, &Value, &Traceback);
    Ref None(PyList_New(0));
    bool Closed = None && exitWith(PyTuple_GET_ITEM(Entry.get(), 1), None.get(), None.get(),
                                   PyTuple_GET_ITEM(Entry.get(), 2));
    if (!Closed) { // (an interrupt that came meanwhile is the program's)
      Py_XDECREF(Type);
      Py_XDECREF(Value);
      Py_XDECREF(Traceback);
      return nullptr;
    }
    PyErr_Restore(Type, Value, Traceback);
    return nullptr;
  }
  if (!exitWith(PyTuple_GET_ITEM(Entry.get(), 1), Outputs.get(), KeywordInputs.get(),
                PyTuple_GET_ITEM(Entry.get(), 2)))
    return nullptr;
  return owned(Py_True);
}

/// What the hooks in C ask of Python beyond their common case, set once by
/// set_hook_fallbacks: the shim's globals (its `_before`, `_after`,
/// `_pre_hook`, `_post_hook` and `_hook_failed`, looked up where they are
/// needed, so that what replaces one there is what is called),
/// torch.compiler's (is_compiling()'s flag), and Dynamo's question whether
/// it is at work on this thread (torch._C._dynamo.eval_frame's
/// get_eval_frame_callback).
PyObject *ShimGlobals, *CompilerGlobals, *DynamoCallback;
PyObject *BeforeName, *AfterName, *PreHookName, *PostHookName, *HookFailedName, *CompilingName;

/// torch.compiler.is_compiling() as code that runs sees it: its flag, set
/// while Dynamo compiles and while torch.export traces without it (the
/// function's other question, torch.jit.is_scripting(), is False in code
/// that runs as Python). 1, 0, or -1 with an exception set.
int compiling() {
  PyObject *Flag = PyDict_GetItemWithError(CompilerGlobals, CompilingName);
  if (!Flag)
    return PyErr_Occurred() ? -1 : 0;
  return PyObject_IsTrue(Flag);
}

/// Whether this thread runs under torch.compile's frame evaluation (a
/// compiled function, or code it let run as it is): 1, 0, or -1 with an
/// exception set.
int underDynamo() {
  Ref Callback(PyObject_CallNoArgs(DynamoCallback));
  return Callback ? Callback.get() != Py_None : -1;
}

/// The shim's global \p Name, called with the hook's arguments.
PyObject *callShim(PyObject *Name, PyObject *const *Args, Py_ssize_t N) {
  PyObject *Function = PyDict_GetItemWithError(ShimGlobals, Name);
  if (!Function) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_AttributeError, "ekka_runtime_python: the shim has no %U", Name);
    return nullptr;
  }
  Ref Held(owned(Function));
  return PyObject_Vectorcall(Function, Args, size_t(N), nullptr);
}

using Hook = PyObject *(*)(PyObject *, PyObject *const *, Py_ssize_t);

/// The shim's _pre_hook or _post_hook (\p Whole), in C. While
/// torch.compiler.is_compiling()'s flag is set (the whole process's), the
/// Python hook, which asks whether this thread compiles; nothing under
/// torch.compile's frame evaluation then, where the Python hook would be
/// compiled first, waiting for the compile under way. Otherwise \p Fast,
/// the common case, or where it declines the shim's \p Slow, as the Python
/// hook would. Under torch.compile's frame evaluation,
/// the Python hook itself: Dynamo compiles a Python function that starts
/// there (the hook, or `_before` called from here), and the hook's first
/// question, is_compiling(), it answers True, so nothing is recorded there,
/// as before there were hooks in C. (Tracing a module's call, Dynamo does not
/// run the hooks at all: it traces the shim's stand-ins for them, which do
/// nothing; see the shim's _hooks_in_graph.) An Exception of theirs is the
/// shim's `_hook_failed`'s (said once, with what of the call is lost; the
/// program goes on); anything else (a KeyboardInterrupt) is the program's.
PyObject *runHook(Hook Fast, PyObject *Slow, PyObject *Whole, const char *Where,
                  PyObject *const *Args, Py_ssize_t N) {
  if (!ShimGlobals) {
    PyErr_SetString(PyExc_RuntimeError, "ekka_runtime_python: set_hook_fallbacks not called");
    return nullptr;
  }
  int Compiling = compiling();
  int Dynamo = Compiling < 0 ? -1 : underDynamo();
  if (Dynamo > 0 && Compiling > 0)
    Py_RETURN_NONE; // the shim's hook, called here, would wait to be compiled
  if (Dynamo > 0 || (Dynamo == 0 && Compiling > 0))
    return callShim(Whole, Args, N); // (whether this thread compiles, it asks)
  Ref Done(Dynamo < 0 ? nullptr : Fast(nullptr, Args, N));
  if (Done && Done.get() == Py_False)
    Done.reset(callShim(Slow, Args, N));
  if (Done)
    Py_RETURN_NONE;
  if (!PyErr_ExceptionMatches(PyExc_Exception))
    return nullptr;
  PyObject *Type, *Value, *Traceback;
  PyErr_Fetch(&Type, &Value, &Traceback);
  PyErr_NormalizeException(&Type, &Value, &Traceback);
  Ref TypeRef(Type), ValueRef(Value), TracebackRef(Traceback);
  if (Value && Traceback)
    PyException_SetTraceback(Value, Traceback);
  Ref Text(PyUnicode_FromString(Where));
  if (!Text)
    return nullptr;
  PyObject *FailedArgs[] = {Text.get(), Value ? Value : Py_None};
  Ref Said(callShim(HookFailedName, FailedArgs, 2));
  if (!Said)
    return nullptr;
  Py_RETURN_NONE;
}

/// pre_hook(module, args, kwargs=None) -> None: the shim's _pre_hook.
PyObject *preHook(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  return runHook(before, BeforeName, PreHookName, "hook before the call", Args, N);
}

/// post_hook(module, args, kwargs, output) or, for a forward that raised,
/// post_hook(module, args, output) -> None: the shim's _post_hook.
PyObject *postHook(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  return runHook(after, AfterName, PostHookName, "hook after the call", Args, N);
}

/// set_hook_fallbacks(shim_globals, compiler_globals, dynamo_callback): what
/// pre_hook and post_hook read: the shim's module globals, torch.compiler's,
/// and torch._C._dynamo.eval_frame.get_eval_frame_callback.
PyObject *setHookFallbacks(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  if (!arity("set_hook_fallbacks", N, 3))
    return nullptr;
  if (!intern({&BeforeName, &AfterName, &PreHookName, &PostHookName, &HookFailedName,
               &CompilingName},
              {"_before", "_after", "_pre_hook", "_post_hook", "_hook_failed",
               "_is_compiling_flag"}))
    return nullptr;
  if (!PyDict_CheckExact(Args[0]) || !PyDict_CheckExact(Args[1]) || !PyCallable_Check(Args[2])) {
    PyErr_SetString(PyExc_TypeError,
                    "set_hook_fallbacks(): expected two dicts and a callable");
    return nullptr;
  }
  keep({&ShimGlobals, &CompilerGlobals, &DynamoCallback}, Args);
  Py_RETURN_NONE;
}

/// set_hooks(state, functorch_level): the shim's `_State`, whose `active`
/// and `started` before() reads and whose `sources` and `local`, made once,
/// it keeps, and torch._C._functorch.maybe_current_level.
PyObject *setHooks(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  if (!arity("set_hooks", N, 2))
    return nullptr;
  if (!intern({&ActiveName, &StartedName, &StackName, &NamesName, &NameName, &ModulesName},
              {"active", "started", "stack", "names", "__name__", "_modules"}))
    return nullptr;
  Ref Dict(PyObject_GenericGetDict(Args[0], nullptr));
  Ref SourcesObject(Dict ? PyObject_GetAttrString(Args[0], "sources") : nullptr);
  Ref LocalObject(SourcesObject ? PyObject_GetAttrString(Args[0], "local") : nullptr);
  if (!LocalObject)
    return nullptr;
  if (!PyDict_CheckExact(SourcesObject.get())) {
    PyErr_SetString(PyExc_TypeError, "set_hooks(): the state's sources is no dict");
    return nullptr;
  }
  PyObject *Values[] = {Dict.get(), SourcesObject.get(), LocalObject.get(), Args[1]};
  keep({&StateDict, &Sources, &Local, &FunctorchLevel}, Values);
  Py_RETURN_NONE;
}

PyMethodDef Methods[] = {
    {"enter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(enter)), METH_FASTCALL,
     "enter(path, class_name, class_qualname, source_file, source_line, is_root, inputs) -> "
     "int: opens a module call (torch.ops.ekka.enter)"},
    {"exit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(exit)), METH_FASTCALL,
     "exit(id, outputs, keyword_inputs, first_keyword_index): closes it (torch.ops.ekka.exit)"},
    {"tensors", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(tensors)),
     METH_FASTCALL,
     "tensors(value, outputs=False) -> list: the tensors in a module's arguments or result "
     "(the shim's _tensors_py, in C)"},
    {"set_tensor_helpers",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setTensorHelpers)), METH_FASTCALL,
     "set_tensor_helpers(tensor_type, parameter_type, opaque, tensors_of_any, tensors_py, "
     "scalar_types): what tensors() asks the shim"},
    {"before", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(before)), METH_FASTCALL,
     "before(module, args, kwargs=None) -> bool: the shim's _before for a call inside an open "
     "one; False: ask _before"},
    {"after", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(after)), METH_FASTCALL,
     "after(module, args, kwargs, output) -> bool: the shim's _after for the last call open; "
     "False: ask _after"},
    {"pre_hook", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(preHook)),
     METH_FASTCALL,
     "pre_hook(module, args, kwargs=None): the shim's _pre_hook (a global forward pre-hook), "
     "with before() for its common case"},
    {"post_hook", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(postHook)),
     METH_FASTCALL,
     "post_hook(module, args, kwargs, output): the shim's _post_hook (a global forward hook), "
     "with after() for its common case"},
    {"set_hook_fallbacks",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setHookFallbacks)),
     METH_FASTCALL,
     "set_hook_fallbacks(shim_globals, compiler_globals, dynamo_callback): where pre_hook and "
     "post_hook find the shim's Python, torch.compiler's _is_compiling_flag, and Dynamo's "
     "get_eval_frame_callback"},
    {"traced_otherwise", tracedOtherwisePy, METH_NOARGS,
     "traced_otherwise() -> bool: the shim's _traced_otherwise (torch.jit's tracer or a "
     "torch.func transform at work)"},
    {"set_hooks", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setHooks)),
     METH_FASTCALL, "set_hooks(state, functorch_level): the shim's _State, which before() and after() read, "
     "and torch._C._functorch.maybe_current_level, which traced_otherwise() may ask"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef Module = {PyModuleDef_HEAD_INIT, "ekka_runtime_python",
                      "Ekka's runtime, as the tracing shim calls it at every module call.", -1,
                      Methods, nullptr, nullptr, nullptr, nullptr};

} // namespace

PyMODINIT_FUNC PyInit_ekka_runtime_python() { return PyModule_Create(&Module); }
