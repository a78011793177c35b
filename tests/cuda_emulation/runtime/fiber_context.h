#pragma once
// Switching between the emulator's fibers (Note [Kernel emulation]).
//
// On x86-64 a dozen instructions save the callee-saved registers and the floating-point
// control words on the current stack and load the next fiber's: no system call, unlike
// swapcontext, which changes the signal mask on every switch (and which AddressSanitizer
// intercepts by clearing the shadow of the whole target stack, making a switch cost a
// megabyte of memset). Elsewhere, ucontext.

#include <cstddef>

#if defined(__x86_64__)

#include <cstdint>

extern "C" void loom_emulation_switch(void** save_sp, void* next_sp);

namespace loom::cuda_emulation {

struct FiberContext {
  void* sp = nullptr;
};

// Saves the running context into `from` and resumes `to`.
inline void switch_context(FiberContext& from, FiberContext& to) {
  loom_emulation_switch(&from.sp, to.sp);
}

// Prepares `context` to run `entry` (which must never return) on [stack, stack + size).
inline void make_context(FiberContext& context, unsigned char* stack, size_t size,
                         void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15};
  auto* slots = reinterpret_cast<uint64_t*>(top);
  slots[-1] = 0;                                      // no caller: backtraces end here
  slots[-2] = reinterpret_cast<uint64_t>(entry);      // where the first switch returns to
  for (int i = 3; i <= 8; ++i) slots[-i] = 0;         // rbp, rbx, r12..r15
  uint32_t mxcsr = 0;
  uint16_t x87 = 0;
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(x87));
  auto* controls = reinterpret_cast<unsigned char*>(&slots[-9]);
  __builtin_memcpy(controls, &mxcsr, 4);
  __builtin_memcpy(controls + 4, &x87, 2);
  context.sp = &slots[-9];
}

}  // namespace loom::cuda_emulation

#else  // not x86-64

#include <ucontext.h>

namespace loom::cuda_emulation {

struct FiberContext {
  ucontext_t context{};
};

inline void switch_context(FiberContext& from, FiberContext& to) {
  swapcontext(&from.context, &to.context);
}

inline void make_context(FiberContext& context, unsigned char* stack, size_t size,
                         void (*entry)()) {
  getcontext(&context.context);
  context.context.uc_stack.ss_sp = stack;
  context.context.uc_stack.ss_size = size;
  context.context.uc_link = nullptr;
  makecontext(&context.context, entry, 0);
}

}  // namespace loom::cuda_emulation

#endif
