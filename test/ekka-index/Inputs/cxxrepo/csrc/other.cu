#include "lib/common.cuh"

namespace lib {
// The same name as in ops.cu: a separate binary's own Launcher.
struct Launcher {
  int id;
};
}  // namespace lib
