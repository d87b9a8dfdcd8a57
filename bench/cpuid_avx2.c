/*
 * cpuid_avx2.c - make this machine look like an AVX2-only CPU to one
 * process tree, so that both sides of a benchmark run their AVX2 code.
 *
 * ONEDNN_MAX_CPU_ISA=AVX2 caps kiln (oneDNN and the kernels that follow
 * oneDNN's effective ISA), but onnxruntime's MLAS, numpy and the rest read
 * CPUID themselves and have no such switch. Linux can make CPUID fault
 * (arch_prctl ARCH_SET_CPUID, where the CPU has CPUID faulting, flag
 * cpuid_fault in /proc/cpuinfo); this library, loaded with LD_AUDIT,
 * turns that on before anything else in the process runs and answers each faulting CPUID from SIGSEGV:
 * the real answer, less AVX-512 (every subset), AVX-VNNI, AMX and the
 * AVX-512 state components - a Haswell-to-Zen3-like AVX2+FMA machine.
 * The setting is kept across fork and clone, reset by execve; LD_AUDIT
 * carries the library into every program the process starts.
 *
 * glibc picks its string functions before any library runs: set
 * GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,... as well to cap those
 * (bench/modelset.sh does). Exits with status 125 when CPUID faulting is
 * not available, so a run never silently measures the wider ISA.
 *
 *     make build/libcpuid_avx2.so
 *     LD_AUDIT=build/libcpuid_avx2.so program ...
 */
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static struct sigaction g_prev;

static void hide(unsigned leaf, unsigned sub, unsigned r[4]) {
    if (leaf == 7 && sub == 0) {
        /* EBX: AVX512F, DQ, IFMA, PF, ER, CD, BW, VL */
        r[1] &= ~(1u << 16 | 1u << 17 | 1u << 21 | 1u << 26 | 1u << 27 | 1u << 28 | 1u << 30 | 1u << 31);
        /* ECX: VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ */
        r[2] &= ~(1u << 1 | 1u << 6 | 1u << 11 | 1u << 12 | 1u << 14);
        /* EDX: 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE, AMX-INT8 */
        r[3] &= ~(1u << 2 | 1u << 3 | 1u << 8 | 1u << 22 | 1u << 23 | 1u << 24 | 1u << 25);
    } else if (leaf == 7 && sub == 1) {
        /* EAX: AVX-VNNI, AVX512-BF16, AMX-FP16, AVX-IFMA; EDX: AVX-VNNI-INT8, AVX10 */
        r[0] &= ~(1u << 4 | 1u << 5 | 1u << 21 | 1u << 23);
        r[3] &= ~(1u << 4 | 1u << 19);
    } else if (leaf == 0xd && sub == 0) {
        /* XCR0 components supported: opmask, ZMM_Hi256, Hi16_ZMM, AMX tile config and data */
        r[0] &= ~(7u << 5 | 3u << 17);
    }
}

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    greg_t *g = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)g[REG_RIP];
    if (sig == SIGSEGV && si->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) {
        unsigned leaf = (unsigned)g[REG_RAX], sub = (unsigned)g[REG_RCX], r[4];
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
        __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
        hide(leaf, sub, r);
        g[REG_RAX] = r[0];
        g[REG_RBX] = r[1];
        g[REG_RCX] = r[2];
        g[REG_RDX] = r[3];
        g[REG_RIP] += 2;
        return;
    }
    /* Not ours: whoever handled SIGSEGV before, else the default (a core). */
    if (g_prev.sa_flags & SA_SIGINFO) {
        g_prev.sa_sigaction(sig, si, ctx);
    } else if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
        g_prev.sa_handler(sig);
    } else {
        signal(sig, SIG_DFL); /* the faulting instruction runs again and kills */
    }
}

static void cpuid_avx2_init(void) {
    static int done;
    if (done++) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev);
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        static const char msg[] = "cpuid_avx2: this CPU or kernel cannot make CPUID fault (no cpuid_fault in /proc/cpuinfo)\n";
        (void)!write(2, msg, sizeof msg - 1);
        _exit(125);
    }
}

/* LD_AUDIT: ld.so calls this before it runs any library's initializers
 * (oneDNN's CPU detection is one), so nothing in the process sees the
 * real CPUID. As LD_PRELOAD the constructor below comes after the
 * initializers of the program's own libraries, in time only for those
 * loaded later (onnxruntime's in Python). */
unsigned la_version(unsigned version) {
    cpuid_avx2_init();
    return version;
}

__attribute__((constructor)) static void cpuid_avx2_ctor(void) { cpuid_avx2_init(); }
