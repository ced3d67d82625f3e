// A stand-in for another LibTorch: a library named libtorch_cpu.so that is
// not the build's (native.test).
extern "C" int ekka_foreign_torch() { return 7; }
