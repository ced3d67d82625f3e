// A program that links the stand-in libtorch_cpu.so (foreign_torch.cpp):
// ekka-trace must refuse to preload its runtime, built against another.
extern "C" int ekka_foreign_torch();
int main() { return ekka_foreign_torch() == 7 ? 0 : 1; }
