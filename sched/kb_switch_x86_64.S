/*
 * kb_switch_x86_64 — where a fresh fiber context starts on x86-64 System V (Linux, the BSDs).
 *
 * The switch itself is inline assembly in kb_sim.c (uctx_switch): it jumps here, with the
 * stack pointer 16-byte aligned at the fresh stack's top and the fiber in rdi, the first time
 * a fiber runs. The entry function's address sits at the stack pointer; it never returns.
 */
    .text
    .globl  kb_fiber_start
    .type   kb_fiber_start, @function
    .p2align 4
kb_fiber_start:
    movq    (%rsp), %rax
    xorl    %ebp, %ebp
    callq   *%rax
    ud2
    .size   kb_fiber_start, .-kb_fiber_start

    .section .note.GNU-stack,"",@progbits
