/* What a threaded engine's hand-over from one pushing thread to one worker costs on this
 * machine, before any engine logic: a calibration for the engine issue's 0.1x target, not a
 * benchmark of any library. Each "operation" is an empty C function; the worker runs it and
 * reports it finished; the time per operation is taken over N pushes and the wait for the last.
 *
 *   cc -O2 -pthread bench/engine_floor.c -o engine_floor && ./engine_floor MODE N
 *
 * MODE:
 *   heap    the shape of mxnet-rt's engine since session 11: an operation allocated per push
 *           (malloc, 256 bytes), linked into an intrusive multi-producer queue (one swap), a
 *           locked count of pushes; the worker returns finished operations on a stack that the
 *           pushing thread frees every 32 pushes.
 *   slab    as heap, with the operations taken in order from a ring of 1024 slots that the
 *           pushing thread reuses once the worker has released them (no malloc, no return stack).
 *   ring    a single-producer ring of 1024 records of 128 bytes that hold the operation itself;
 *           the pushing thread publishes a tail index (a plain store), the worker marks each
 *           record done; no locked instruction on either side.
 * Prints the median of 5 rounds in microseconds per operation.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct Op {
  _Atomic(struct Op *) next;
  _Atomic(struct Op *) dead;
  _Atomic long refs;
  void (*f)(void *);
  void *param;
  long pad[27];
} Op; /* 256 bytes */

typedef struct {
  _Atomic long done;
  void (*f)(void *);
  void *param;
  long pad[13];
} Rec; /* 128 bytes */

#define SLOTS 1024
static int mode; /* 0 heap, 1 slab, 2 ring */
static Op stub;
static _Alignas(128) _Atomic(Op *) tail = &stub;
static _Alignas(128) Op *head = &stub;
static _Alignas(128) _Atomic(Op *) grave;
static _Alignas(128) _Atomic long finished;
static _Alignas(128) _Atomic long pushed;
static _Alignas(128) _Atomic long ring_tail;
static Rec *ring;
static Op *slab;

static void empty_op(void *p) { (void)p; }

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void link_op(Op *n) {
  Op *prev;
  atomic_store_explicit(&n->next, NULL, memory_order_relaxed);
  prev = atomic_exchange(&tail, n);
  atomic_store_explicit(&prev->next, n, memory_order_release);
}

/* Vyukov's intrusive queue, single consumer. */
static Op *pop(void) {
  Op *h = head, *n = atomic_load_explicit(&h->next, memory_order_acquire);
  if (h == &stub) {
    if (!n) return NULL;
    head = h = n;
    n = atomic_load_explicit(&n->next, memory_order_acquire);
  }
  if (n) {
    head = n;
    return h;
  }
  if (h != atomic_load(&tail)) return NULL;
  link_op(&stub);
  n = atomic_load_explicit(&h->next, memory_order_acquire);
  if (n) {
    head = n;
    return h;
  }
  return NULL;
}

static void *worker(void *arg) {
  long h = 0;
  (void)arg;
  for (;;) {
    if (mode == 2) {
      long t = atomic_load_explicit(&ring_tail, memory_order_acquire);
      if (h == t) {
        __builtin_ia32_pause();
        continue;
      }
      for (; h < t; h++) {
        Rec *r = &ring[h % SLOTS];
        r->f(r->param);
        atomic_store_explicit(&r->done, 1, memory_order_release);
        atomic_store_explicit(&finished, h + 1, memory_order_release);
      }
    } else {
      Op *o = pop();
      if (!o) {
        __builtin_ia32_pause();
        continue;
      }
      o->f(o->param);
      if (mode == 0) {
        Op *g = atomic_load_explicit(&grave, memory_order_relaxed);
        do atomic_store_explicit(&o->dead, g, memory_order_relaxed);
        while (!atomic_compare_exchange_weak(&grave, &g, o));
      } else {
        atomic_store_explicit(&o->refs, 0, memory_order_release);
      }
      atomic_fetch_add(&finished, 1);
    }
  }
  return NULL;
}

static void reap(void) {
  Op *p = atomic_exchange(&grave, NULL);
  while (p) {
    Op *n = atomic_load_explicit(&p->dead, memory_order_relaxed);
    free(p);
    p = n;
  }
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  pthread_t th;
  long n, i, next = 0, t = 0;
  double us[5];
  int r;
  if (argc != 3 || (strcmp(argv[1], "heap") && strcmp(argv[1], "slab") && strcmp(argv[1], "ring"))) {
    fprintf(stderr, "usage: engine_floor heap|slab|ring N\n");
    return 2;
  }
  mode = !strcmp(argv[1], "heap") ? 0 : !strcmp(argv[1], "slab") ? 1 : 2;
  n = atol(argv[2]);
  ring = aligned_alloc(4096, sizeof(Rec) * SLOTS);
  slab = aligned_alloc(4096, sizeof(Op) * SLOTS);
  memset(slab, 0, sizeof(Op) * SLOTS);
  for (i = 0; i < SLOTS; i++) ring[i].done = 1;
  pthread_create(&th, NULL, worker, NULL);
  for (r = 0; r < 5; r++) {
    double t0 = now();
    long base = atomic_load(&finished);
    for (i = 0; i < n; i++) {
      if (mode == 2) {
        Rec *rc = &ring[t % SLOTS];
        while (!atomic_load_explicit(&rc->done, memory_order_acquire)) __builtin_ia32_pause();
        rc->done = 0;
        rc->f = empty_op;
        rc->param = NULL;
        t++;
        atomic_store_explicit(&ring_tail, t, memory_order_release);
      } else {
        Op *o;
        if (mode == 0) {
          o = malloc(sizeof(Op));
        } else {
          o = &slab[next++ % SLOTS];
          while (atomic_load_explicit(&o->refs, memory_order_acquire) != 0) __builtin_ia32_pause();
        }
        memset(o, 0, sizeof(Op));
        o->refs = 1;
        o->f = empty_op;
        atomic_fetch_add(&pushed, 1);
        link_op(o);
        if (mode == 0 && i % 32 == 0) reap();
      }
    }
    while (atomic_load(&finished) - base < n) __builtin_ia32_pause();
    if (mode == 0) reap();
    us[r] = (now() - t0) / n * 1e6;
  }
  qsort(us, 5, sizeof us[0], cmp);
  printf("{\"mode\": \"%s\", \"ops\": %ld, \"us_per_op_median\": %.4f}\n", argv[1], n, us[2]);
  return 0;
}
