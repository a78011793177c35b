// loom_emulation_switch(void** save_sp, void* next_sp): saves the callee-saved registers and
// the MXCSR and x87 control words on the current stack, stores the stack pointer in
// *save_sp, and resumes the context whose stack pointer is next_sp (fiber_context.h).
#if defined(__x86_64__)
    .text
    .globl loom_emulation_switch
    .type loom_emulation_switch, @function
loom_emulation_switch:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .cfi_endproc
    .size loom_emulation_switch, .-loom_emulation_switch
#endif
    .section .note.GNU-stack, "", @progbits
