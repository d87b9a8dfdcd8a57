/* emu.cpp - the fiber scheduler behind emu.h: blocks in turn, threads as
 * ucontext fibers, block and warp barriers. */
#include "kernels/cuda/emu/emu.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <cstdio>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_TSAN 1
#endif
#endif
#ifdef EMU_TSAN
/* ThreadSanitizer must know each fiber is a context of its own; flag 0
 * makes every switch a synchronization, which it is (one runs at a time). */
extern "C" void *__tsan_get_current_fiber(void);
extern "C" void *__tsan_create_fiber(unsigned flags);
extern "C" void __tsan_switch_to_fiber(void *fiber, unsigned flags);
#endif
#ifdef EMU_ASAN
extern "C" void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
#endif

namespace emu {

block_state g_block;
uint3 *g_tid;
int g_linear_tid;
uint64_t *g_slots;
void *g_dyn_shared;
cudaError_t g_last_error;

namespace {

enum fiber_state { FIBER_RUN, FIBER_WAIT_BLOCK, FIBER_WAIT_WARP, FIBER_DONE };

struct fiber {
    ucontext_t ctx;
    uint3 tid;
    fiber_state state;
    char *stack;
    void *tsan; /* ThreadSanitizer's fiber, made once per slot */
};

/* Kernels are shallow; sanitizers make frames larger. */
#ifdef EMU_ASAN
const size_t k_stack_size = 256 * 1024;
#else
const size_t k_stack_size = 64 * 1024;
#endif

ucontext_t g_main;
std::vector<fiber> g_fibers;
std::vector<uint64_t> g_slot_buf;
std::vector<unsigned char> g_dyn_buf;
char *g_stacks;
size_t g_stacks_n;
int g_cur;
const std::function<void()> *g_body;
uint64_t g_launches, g_fiber_runs;
#ifdef EMU_TSAN
void *g_main_tsan;
#endif
#ifdef EMU_ASAN
const void *g_main_bottom;
size_t g_main_size;
#endif

[[noreturn]] void fail(const char *what) {
    fprintf(stderr, "cuda emulation: %s (block %u,%u,%u thread %u,%u,%u)\n", what, g_block.bidx.x, g_block.bidx.y,
            g_block.bidx.z, g_tid ? g_tid->x : 0, g_tid ? g_tid->y : 0, g_tid ? g_tid->z : 0);
    abort();
}

/* Switches from the running fiber back to the scheduler. */
void yield_to_main() {
    fiber &f = g_fibers[(size_t)g_cur];
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(g_main_tsan, 0);
#endif
#ifdef EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, g_main_bottom, g_main_size);
    swapcontext(&f.ctx, &g_main);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    swapcontext(&f.ctx, &g_main);
#endif
}

void fiber_entry() {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g_main_bottom, &g_main_size);
#endif
    (*g_body)();
    g_fibers[(size_t)g_cur].state = FIBER_DONE;
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(g_main_tsan, 0);
#endif
#ifdef EMU_ASAN
    /* NULL: this fiber's fake stack is not kept, it ends here. */
    __sanitizer_start_switch_fiber(nullptr, g_main_bottom, g_main_size);
#endif
    setcontext(&g_main);
}

void resume(int i) {
    fiber &f = g_fibers[(size_t)i];
    g_cur = i;
    g_tid = &f.tid;
    g_linear_tid = i;
#ifdef EMU_TSAN
    if (!f.tsan) f.tsan = __tsan_create_fiber(0);
    g_main_tsan = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(f.tsan, 0);
#endif
#ifdef EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack, k_stack_size);
    swapcontext(&g_main, &f.ctx);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    swapcontext(&g_main, &f.ctx);
#endif
}

void ensure_stacks(size_t n) {
    if (n <= g_stacks_n) return;
    if (g_stacks) munmap(g_stacks, g_stacks_n * k_stack_size);
    void *p = mmap(nullptr, n * k_stack_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("cannot map fiber stacks");
    g_stacks = (char *)p;
    g_stacks_n = n;
}

/* Separate and not inlined: getcontext returns twice, which must not touch
 * the caller's loop variables (-Wclobbered). */
__attribute__((noinline)) void init_fiber(int i) {
    fiber &f = g_fibers[(size_t)i];
    f.tid.x = (unsigned)i % g_block.block.x;
    f.tid.y = ((unsigned)i / g_block.block.x) % g_block.block.y;
    f.tid.z = (unsigned)i / (g_block.block.x * g_block.block.y);
    f.state = FIBER_RUN;
    f.stack = g_stacks + (size_t)i * k_stack_size;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = k_stack_size;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
}

void run_block(int nthreads) {
    for (int i = 0; i < nthreads; i++) init_fiber(i);
    g_fiber_runs += (uint64_t)nthreads;
    for (;;) {
        for (int i = 0; i < nthreads; i++)
            if (g_fibers[(size_t)i].state == FIBER_RUN) resume(i);
        int live = 0, at_block = 0;
        for (int i = 0; i < nthreads; i++) {
            fiber_state s = g_fibers[(size_t)i].state;
            if (s != FIBER_DONE) live++;
            if (s == FIBER_WAIT_BLOCK) at_block++;
        }
        if (live == 0) return;
        int released = 0;
        /* A warp barrier opens when every live lane of the warp is at it. */
        for (int w = 0; w < nthreads; w += 32) {
            int n_live = 0, n_warp = 0, n_block = 0;
            for (int i = w; i < w + 32 && i < nthreads; i++) {
                fiber_state s = g_fibers[(size_t)i].state;
                if (s != FIBER_DONE) n_live++;
                if (s == FIBER_WAIT_WARP) n_warp++;
                if (s == FIBER_WAIT_BLOCK) n_block++;
            }
            if (n_warp && n_block) {
                g_tid = &g_fibers[(size_t)w].tid;
                fail("part of a warp is in a warp shuffle while another part waits at __syncthreads");
            }
            if (n_warp && n_warp == n_live) {
                for (int i = w; i < w + 32 && i < nthreads; i++)
                    if (g_fibers[(size_t)i].state == FIBER_WAIT_WARP) g_fibers[(size_t)i].state = FIBER_RUN;
                released = 1;
            }
        }
        if (!released && at_block == live) {
            for (int i = 0; i < nthreads; i++)
                if (g_fibers[(size_t)i].state == FIBER_WAIT_BLOCK) g_fibers[(size_t)i].state = FIBER_RUN;
            released = 1;
        }
        if (!released) fail("deadlock: threads wait at barriers that the others never reach");
    }
}

} // namespace

void syncthreads() {
    g_fibers[(size_t)g_cur].state = FIBER_WAIT_BLOCK;
    yield_to_main();
}

void warp_sync() {
    g_fibers[(size_t)g_cur].state = FIBER_WAIT_WARP;
    yield_to_main();
}

void launch(dim3 grid, dim3 block, size_t dyn_shared, const std::function<void()> &body) {
    uint64_t nthreads = (uint64_t)block.x * block.y * block.z;
    /* The limits every GPU kiln supports enforces. */
    if (nthreads == 0 || nthreads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535 || dyn_shared > 48 * 1024) {
        fprintf(stderr, "cuda emulation: invalid launch grid (%u,%u,%u) block (%u,%u,%u) shared %zu\n", grid.x, grid.y,
                grid.z, block.x, block.y, block.z, dyn_shared);
        g_last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (g_body) fail("a kernel launched from inside a kernel");
    g_launches++;
    if (g_fibers.size() < nthreads) g_fibers.resize(nthreads);
    if (g_slot_buf.size() < nthreads) g_slot_buf.resize(nthreads);
    ensure_stacks(nthreads);
    g_dyn_buf.assign(dyn_shared + 16, 0xA5); /* garbage, like real shared memory */
    g_dyn_shared = g_dyn_buf.data();
    g_slots = g_slot_buf.data();
    g_block.grid = grid;
    g_block.block = block;
    g_body = &body;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                g_block.bidx.x = x;
                g_block.bidx.y = y;
                g_block.bidx.z = z;
                run_block((int)nthreads);
            }
    g_body = nullptr;
    g_tid = nullptr;
}

uint64_t launch_count() { return g_launches; }
uint64_t fiber_count() { return g_fiber_runs; }

} // namespace emu
