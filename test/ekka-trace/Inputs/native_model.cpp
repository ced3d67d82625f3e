//===- native_model.cpp - A C++ LibTorch program's work, for native.test --===//
//
// What native_program.cpp's main runs: linked into the program itself
// (ekka-native-program), or from a library of its own that links LibTorch
// while the program does not (ekka-native-indirect-program), as an engine's
// executable does. No Python anywhere: two record_function scopes holding ATen ops, the
// result printed, whether the processes it would start get Ekka's runtime
// preloaded, and an exit code of its own (the first argument).
// Seeded as Python's torch.manual_seed(0) seeds the same CPU generator, so
// the test recomputes what it computed.
//
//===----------------------------------------------------------------------===//
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int nativeModel(int argc, char **argv) {
  at::manual_seed(0);
  at::Tensor W = at::randn({8, 8});
  at::Tensor X = at::randn({4, 8});
  at::Tensor H;
  {
    RECORD_USER_SCOPE("layer0");
    H = at::relu(at::mm(X, W));
  }
  {
    RECORD_USER_SCOPE("layer1");
    H = at::softmax(at::mm(H, W), -1);
  }
  std::printf("sum %.4f\n", H.sum().item<double>());
  const char *Preload = std::getenv("LD_PRELOAD");
  std::printf("children preload %s\n",
              Preload && std::strstr(Preload, "ekka_runtime") ? "the runtime" : "nothing");
  return argc > 1 ? std::atoi(argv[1]) : 0;
}
