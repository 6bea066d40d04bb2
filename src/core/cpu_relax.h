// cpu_relax.h — the spin-wait hint: one PAUSE (x86) or YIELD (Arm) per poll
// of a busy-wait loop, so the sibling hyperthread and the memory system are
// not flooded while a flag is polled.
#pragma once

namespace ferry {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace ferry
