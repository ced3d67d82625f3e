//===- native_model.cpp - A C++ LibTorch program's work, for native.test --===//
//
// What native_program.cpp's main runs: linked into the program itself
// (ekka-native-program), or from a library of its own that links LibTorch
// while the program does not (ekka-native-indirect-program), as an engine's
// executable does. No Python anywhere: two record_function scopes holding ATen ops, the
// result printed, whether the processes it would start get Ekka's runtime
// preloaded, and an exit code of its own (the first argument); replacing
// itself with another program, or failing to, on request (the second).
// Seeded as Python's torch.manual_seed(0) seeds the same CPU generator, so
// the test recomputes what it computed.
//
//===----------------------------------------------------------------------===//
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

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
  // Replaced by another program (which exits with 4), or failing to be,
  // and going on.
  if (argc > 2 && std::strcmp(argv[2], "exec") == 0) {
    std::fflush(stdout);
    execl("/bin/sh", "sh", "-c", "echo replaced; exit 4", static_cast<char *>(nullptr));
  } else if (argc > 2 && std::strcmp(argv[2], "exec-fails") == 0) {
    execl("/nonexistent/program", "program", static_cast<char *>(nullptr));
    RECORD_USER_SCOPE("after_exec");
    std::printf("exec failed, sum %.4f\n", at::mm(H, W).sum().item<double>());
  }
  return argc > 1 ? std::atoi(argv[1]) : 0;
}
