//===- HostTest.cpp - What a trace records of its machine -----------------===//
#include "ekka/Support/Host.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

using namespace ekka;

namespace {

TEST(Host, AnX86CPUIsItsModelAndTheExtensionsThatChooseKernels) {
  const char *Info = "processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                     "model name\t: AMD EPYC 7B13\n"
                     "flags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2 sha_ni\n\n"
                     "processor\t: 1\nmodel name\t: AMD EPYC 7B13\n"
                     "flags\t\t: fpu sse avx avx2 avx512f\n";
  // The first processor's: a second that differs is not this machine's
  // common ground.
  EXPECT_EQ(describeCpu(Info, 2), "AMD EPYC 7B13; 2 CPUs; avx avx2 fma f16c");
  EXPECT_EQ(describeCpu("model name : Intel(R) Xeon(R) Platinum 8480+\nflags : avx2 "
                        "avx512f amx_bf16 avx512_bf16 amx_tile\n",
                        1),
            "Intel(R) Xeon(R) Platinum 8480+; 1 CPU; avx2 avx512f avx512_bf16 amx_tile "
            "amx_bf16");
}

TEST(Host, AnArmCPUHasFeaturesAndMayHaveNoModelName) {
  EXPECT_EQ(describeCpu("processor\t: 0\nBogoMIPS\t: 50.00\n"
                        "Features\t: fp asimd evtstrm aes sve sve2 bf16 i8mm\n"
                        "CPU implementer\t: 0x41\n",
                        64),
            "unknown CPU; 64 CPUs; asimd sve sve2 bf16 i8mm");
}

TEST(Host, NothingReadableIsSaidAsUnknown) {
  EXPECT_EQ(describeCpu("", 4), "unknown CPU; 4 CPUs; no vector extensions known");
  EXPECT_EQ(describeCpu("model name : x\nflags : fpu sse\n", 1),
            "x; 1 CPU; no vector extensions known");
  EXPECT_EQ(describeCpu("model name : x\n", 0), "x; an unknown number of CPUs; no vector "
                                                 "extensions known");
}

TEST(Host, TheMachinesOwnIsItsCpuinfoAndItsThreads) {
  std::string Info;
  if (std::FILE *F = std::fopen("/proc/cpuinfo", "r")) {
    char Buffer[4096];
    while (size_t N = std::fread(Buffer, 1, sizeof Buffer, F))
      Info.append(Buffer, N);
    std::fclose(F);
  }
  EXPECT_EQ(describeHostCpu(), describeCpu(Info, std::thread::hardware_concurrency()));
}

} // namespace
