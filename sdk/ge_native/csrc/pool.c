#include "prelude.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#define GE_MAX_WORKERS 63
/* how long an idle worker looks for the next job (yielding the core to anyone who wants it)
   before it sleeps: a run's parallel kernels come tens to hundreds of microseconds apart */
#define GE_SPIN_US 1000.0
static struct {
    ge_task_t fn; void *ctx; int64_t n; int64_t cap;
    atomic_llong next, done;
    atomic_int open, active, joined;
    atomic_uint seq;
} job;
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t sleep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cv = PTHREAD_COND_INITIALIZER;
static atomic_int sleepers;
static int nworkers;
static _Thread_local int in_task;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}


/* a job of up to GE_STATIC_MAX tasks is shared out in ranges: participant `slot` of `cap` runs
   tasks [slot * n / cap, (slot + 1) * n / cap) first, then claims whatever is left of the others'
   (each task's flag taken once), so a descheduled participant still costs at most the task it
   holds. Consecutive layers with the same split then find their inputs in the core's own cache:
   claimed in arrival order, the tasks landed on either thread at random, and a layer read about
   half its input from the other core's (ShuffleNet at 2 threads, vCPUs 190 ns apart: ge/ORT
   1.42-1.60 -> 1.32-1.36; SqueezeNet 1.04-1.12 -> 0.96-1.02) */
#define GE_STATIC_MAX 4096
static atomic_char claimed[GE_STATIC_MAX];
static void run_share(int slot) {
    int64_t n = job.n, cap = job.cap;
    if (n <= GE_STATIC_MAX) {
        int64_t lo = slot * n / cap, hi = (slot + 1) * n / cap;
        for (int pass = 0; pass < 2; pass++)
            for (int64_t i = pass ? 0 : lo; i < (pass ? n : hi); i++)
                if (!atomic_exchange_explicit(&claimed[i], 1, memory_order_acq_rel)) {
                    job.fn(job.ctx, i, slot);
                    atomic_fetch_add_explicit(&job.done, 1, memory_order_release);
                }
        return;
    }
    for (;;) {
        int64_t i = atomic_fetch_add(&job.next, 1);
        if (i >= n) break;
        job.fn(job.ctx, i, slot);
        atomic_fetch_add_explicit(&job.done, 1, memory_order_release);
    }
}

static void *worker(void *arg) {
    (void)arg;
    unsigned seen = atomic_load(&job.seq);
    in_task = 1;
    for (;;) {
        double t0 = now_us();
        while (atomic_load_explicit(&job.seq, memory_order_acquire) == seen) {
            if (now_us() - t0 > GE_SPIN_US) {
                pthread_mutex_lock(&sleep_mu);
                atomic_fetch_add(&sleepers, 1);
                while (atomic_load(&job.seq) == seen) pthread_cond_wait(&sleep_cv, &sleep_mu);
                atomic_fetch_sub(&sleepers, 1);
                pthread_mutex_unlock(&sleep_mu);
                break;
            }
            sched_yield();
        }
        seen = atomic_load(&job.seq);
        atomic_fetch_add(&job.active, 1);
        if (atomic_load(&job.open)) {
            int slot = 1 + atomic_fetch_add(&job.joined, 1);
            if (slot < job.cap) run_share(slot);
        }
        atomic_fetch_sub(&job.active, 1);
    }
    return 0;
}

static void pool_parallel(ge_task_t fn, void *ctx, int64_t n, int64_t threads) {
    if (in_task || threads <= 1 || n <= 1 || pthread_mutex_trylock(&call_mu) != 0) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    int want = (int)(threads - 1 < GE_MAX_WORKERS ? threads - 1 : GE_MAX_WORKERS);
    while (nworkers < want) {
        pthread_t t;
        if (pthread_create(&t, 0, worker, 0) != 0) break;
        pthread_detach(t);
        nworkers++;
    }
    job.fn = fn; job.ctx = ctx; job.n = n; job.cap = threads;
    if (n <= GE_STATIC_MAX)
        for (int64_t i = 0; i < n; i++) atomic_store_explicit(&claimed[i], 0, memory_order_relaxed);
    atomic_store(&job.next, 0);
    atomic_store(&job.done, 0);
    atomic_store(&job.joined, 0);
    atomic_store(&job.open, 1);
    atomic_fetch_add_explicit(&job.seq, 1, memory_order_release);
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&sleep_mu);
        pthread_cond_broadcast(&sleep_cv);
        pthread_mutex_unlock(&sleep_mu);
    }
    in_task = 1;
    run_share(0);
    in_task = 0;
    while (atomic_load_explicit(&job.done, memory_order_acquire) < n) sched_yield();  /* tasks workers hold */
    atomic_store(&job.open, 0);
    while (atomic_load(&job.active) > 0) sched_yield();  /* a worker between waking and its first look */
    pthread_mutex_unlock(&call_mu);
}

static ge_parallel_t pool_entry = pool_parallel;

/* a forked child has none of the workers: it starts from an empty pool */
static void child_reset(void) {
    nworkers = 0;
    in_task = 0;
    atomic_store(&job.open, 0);
    atomic_store(&job.active, 0);
    atomic_store(&sleepers, 0);
    pthread_mutex_init(&call_mu, 0);
    pthread_mutex_init(&sleep_mu, 0);
    pthread_cond_init(&sleep_cv, 0);
}

static PyObject *capsule(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    static int registered = 0;
    if (ge_nargs(n, 0)) return NULL;
    if (!registered) {
        pthread_atfork(0, 0, child_reset);
        registered = 1;
    }
    return PyCapsule_New((void *)&pool_entry, "ge_native_pool", 0);
}
