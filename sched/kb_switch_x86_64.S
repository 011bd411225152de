/*
 * kb_switch_x86_64 — the fiber context switch for x86-64 System V (Linux, the BSDs).
 *
 * A suspended context is its stack pointer, below which the switch has pushed the callee-saved
 * registers (rbp, rbx, r15 .. r12) on top of the return address of its kb_switch call. The
 * MXCSR and x87 control words, which the ABI also makes callee-saved, are not saved: kbcl never
 * changes them.
 *
 *   kb_switch_transfer kb_switch(void *to, void *data)      (rdi, rsi -> rax, rdx)
 *     suspends the caller, resumes `to`, and hands it {the caller's context, data} as the
 *     return value of the kb_switch that suspended it (or as the argument of its entry).
 *   kb_switch_entry
 *     where a fresh context (laid out by kb_switch_make in kb_sim.c) starts: calls the entry
 *     function kept in r12 with the transfer in rdi:rsi. The entry function never returns.
 */
    .text
    .globl  kb_switch
    .type   kb_switch, @function
    .p2align 4
kb_switch:
    pushq   %rbp
    pushq   %rbx
    pushq   %r15
    pushq   %r14
    pushq   %r13
    pushq   %r12
    movq    %rsp, %rax
    movq    %rdi, %rsp
    popq    %r12
    popq    %r13
    popq    %r14
    popq    %r15
    popq    %rbx
    popq    %rbp
    popq    %r8
    movq    %rsi, %rdx
    jmp     *%r8                 /* not ret: the return-stack predictor holds the other side */
    .size   kb_switch, .-kb_switch

    .globl  kb_switch_entry
    .type   kb_switch_entry, @function
    .p2align 4
kb_switch_entry:
    movq    %rax, %rdi
    movq    %rdx, %rsi
    callq   *%r12
    ud2
    .size   kb_switch_entry, .-kb_switch_entry

    .section .note.GNU-stack,"",@progbits
