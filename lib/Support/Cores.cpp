#include "soap/Support/Cores.h"

#include <algorithm>
#include <sched.h>
#include <thread>

namespace soap {

int availableCores() {
  cpu_set_t set;
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0
                  ? CPU_COUNT(&set)
                  : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores);
}

} // namespace soap
