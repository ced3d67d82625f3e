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

PyMethodDef Methods[] = {
    {"enter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(enter)), METH_FASTCALL,
     "enter(path, class_name, class_qualname, source_file, source_line, is_root, inputs) -> "
     "int: opens a module call (torch.ops.ekka.enter)"},
    {"exit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(exit)), METH_FASTCALL,
     "exit(id, outputs, keyword_inputs, first_keyword_index): closes it (torch.ops.ekka.exit)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef Module = {PyModuleDef_HEAD_INIT, "ekka_runtime_python",
                      "Ekka's runtime, as the tracing shim calls it at every module call.", -1,
                      Methods, nullptr, nullptr, nullptr, nullptr};

} // namespace

PyMODINIT_FUNC PyInit_ekka_runtime_python() { return PyModule_Create(&Module); }
