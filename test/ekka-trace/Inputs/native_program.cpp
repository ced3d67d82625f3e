//===- native_program.cpp - A C++ LibTorch program, for native.test -------===//
//
// Its work is native_model.cpp's, linked in or from a library of its own.
//
//===----------------------------------------------------------------------===//
int nativeModel(int argc, char **argv);

int main(int argc, char **argv) { return nativeModel(argc, argv); }
