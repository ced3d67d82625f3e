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

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <exception>
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

/// enter(path, class_name, class_qualname, source_file, source_line,
/// is_root, inputs) -> call id (0: not recorded)
PyObject *enter(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  std::string_view Path, ClassName, Qualname, File;
  int64_t Line = 0;
  std::vector<at::Tensor> Inputs;
  if (!arity("enter", N, 7) || !stringOf(Args[0], Path) || !stringOf(Args[1], ClassName) ||
      !stringOf(Args[2], Qualname) || !stringOf(Args[3], File) || !integerOf(Args[4], Line))
    return nullptr;
  int IsRoot = PyObject_IsTrue(Args[5]);
  if (IsRoot < 0 || !tensorsOf(Args[6], Inputs))
    return nullptr;
  int64_t Id;
  Py_BEGIN_ALLOW_THREADS
  Id = ekka::enterModuleNoThrow(Path, ClassName, Qualname, File, Line, IsRoot != 0, Inputs);
  Py_END_ALLOW_THREADS
  return PyLong_FromLongLong(Id);
}

/// exit(call id, outputs, keyword_inputs, first_keyword_index) -> None
PyObject *exit(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  int64_t Id = 0, FirstKeyword = 0;
  std::vector<at::Tensor> Outputs, KeywordInputs;
  if (!arity("exit", N, 4) || !integerOf(Args[0], Id) || !tensorsOf(Args[1], Outputs) ||
      !tensorsOf(Args[2], KeywordInputs) || !integerOf(Args[3], FirstKeyword))
    return nullptr;
  Py_BEGIN_ALLOW_THREADS
  ekka::exitModuleNoThrow(Id, Outputs, KeywordInputs, FirstKeyword);
  Py_END_ALLOW_THREADS
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

/// set_tensor_helpers(tensor_type, parameter_type, opaque, tensors_of_any,
/// tensors_py, scalar_types)
PyObject *setTensorHelpers(PyObject *, PyObject *const *Args, Py_ssize_t N) {
  if (!arity("set_tensor_helpers", N, HelperCount))
    return nullptr;
  PyObject **Slots[] = {&TensorType, &ParameterType, &OpaqueFn, &OfAnyFn, &PythonFn, &ScalarTypes};
  for (int I = 0; I < HelperCount; ++I) {
    Py_INCREF(Args[I]);
    Py_XSETREF(*Slots[I], Args[I]);
  }
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
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef Module = {PyModuleDef_HEAD_INIT, "ekka_runtime_python",
                      "Ekka's runtime, as the tracing shim calls it at every module call.", -1,
                      Methods, nullptr, nullptr, nullptr, nullptr};

} // namespace

PyMODINIT_FUNC PyInit_ekka_runtime_python() { return PyModule_Create(&Module); }
