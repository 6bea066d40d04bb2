/* handoff_test.c — the node handoff from C (ferry_handoff_*): two real
 * processes (forked before either opens anything: no thread crosses the
 * fork), host memory on both ends (device -1), random sizes from a printed
 * seed, odd sizes and zeros, items larger than a slot, destinations poisoned
 * with guard bytes; a consumer that dies gives the producer
 * FERRY_ERROR_PEER_GONE, a consumer that never comes FERRY_ERROR_TIMEOUT, and
 * after either every call says FERRY_ERROR_BROKEN; bad arguments are
 * FERRY_ERROR_INVALID_ARGUMENT with a message; a GPU side opens or says
 * FERRY_ERROR_NO_DEVICE. Exit 0: all passed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"

static int failures = 0;
#define CHECK(cond)                                                                       \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "%s:%d: [%d] CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, \
              (int)getpid(), #cond, ferry_last_error());                                  \
      ++failures;                                                                         \
    }                                                                                     \
  } while (0)

#define ROUNDS 40
#define MAX_ITEMS 24

static unsigned long long rng_state;
static unsigned long long next_random(void) { /* splitmix64 */
  unsigned long long z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Round r: its item count and sizes (the same on both sides), some 0, one in 5 rounds larger than a slot. */
static size_t round_sizes(unsigned long long seed, int r, uint64_t* sizes) {
  rng_state = seed * 1000 + (unsigned long long)r;
  size_t n = 1 + next_random() % MAX_ITEMS;
  for (size_t i = 0; i < n; ++i) sizes[i] = next_random() % 5 == 0 ? 0 : next_random() % 7001;
  if (r % 5 == 2) sizes[next_random() % n] = 20001; /* spans several 8 KiB slots */
  return n;
}
static unsigned char byte_at(unsigned long long seed, int r, size_t i, size_t k) {
  return (unsigned char)((seed * 31 + (unsigned long long)r * 7 + i * 13 + k * 101 + (k >> 8)) & 0xFF);
}

static ferry_node_pool_t open_pool(const char* name, const char* label) {
  ferry_node_pool_options_t o;
  CHECK(ferry_node_pool_options_init(&o) == FERRY_SUCCESS);
  o.capacity = 4 << 20;
  o.label = label;
  o.attach_timeout_s = 30;
  ferry_node_pool_t pool = NULL;
  CHECK(ferry_node_pool_open(name, &o, &pool) == FERRY_SUCCESS);
  return pool;
}

static ferry_handoff_t open_handoff(ferry_node_pool_t pool, double timeout_s, ferry_status_t* status) {
  ferry_handoff_options_t o;
  CHECK(ferry_handoff_options_init(&o) == FERRY_SUCCESS);
  CHECK(o.slots == 4 && o.slot_bytes == (64u << 20) && o.route == FERRY_HANDOFF_ROUTE_AUTO && o.timeout_s == 60);
  CHECK(o.peer_sms == 32 && o.reserved == 0);
  o.slots = 3;
  o.slot_bytes = 5000; /* rounded up to 8 KiB */
  o.timeout_s = timeout_s;
  o.poll_s = 0.05;
  ferry_handoff_t h = NULL;
  const ferry_status_t s = ferry_handoff_open(pool, "kv", &o, -1, &h);
  if (status) *status = s;
  else CHECK(s == FERRY_SUCCESS);
  return h;
}

static ferry_status_t send_round(ferry_handoff_t h, unsigned long long seed, int r) {
  uint64_t sizes[MAX_ITEMS];
  const size_t n = round_sizes(seed, r, sizes);
  unsigned char* items[MAX_ITEMS];
  const void* srcs[MAX_ITEMS];
  for (size_t i = 0; i < n; ++i) {
    items[i] = malloc(sizes[i] + 1);
    for (size_t k = 0; k < sizes[i]; ++k) items[i][k] = byte_at(seed, r, i, k);
    srcs[i] = items[i];
  }
  uint64_t bytes = 0;
  const ferry_status_t s = ferry_handoff_send(h, srcs, sizes, n, &bytes);
  if (s == FERRY_SUCCESS) CHECK(bytes >= sizes[n - 1]);
  for (size_t i = 0; i < n; ++i) free(items[i]);
  return s;
}

static void recv_round(ferry_handoff_t h, unsigned long long seed, int r) {
  uint64_t sizes[MAX_ITEMS];
  const size_t n = round_sizes(seed, r, sizes);
  unsigned char* out[MAX_ITEMS];
  void* dsts[MAX_ITEMS];
  for (size_t i = 0; i < n; ++i) {
    out[i] = malloc(sizes[i] + 3);
    memset(out[i], 0xEE, sizes[i] + 3); /* poisoned, 3 guard bytes */
    dsts[i] = out[i];
  }
  CHECK(ferry_handoff_recv(h, dsts, sizes, n, NULL) == FERRY_SUCCESS);
  for (size_t i = 0; i < n; ++i) {
    size_t bad = 0;
    for (size_t k = 0; k < sizes[i]; ++k) bad += out[i][k] != byte_at(seed, r, i, k);
    for (size_t k = sizes[i]; k < sizes[i] + 3; ++k) bad += out[i][k] != 0xEE;
    if (bad) fprintf(stderr, "round %d item %zu (%llu bytes): %zu bytes wrong (seed %llu)\n", r, i,
                     (unsigned long long)sizes[i], bad, seed);
    CHECK(bad == 0);
    free(out[i]);
  }
}

/* The consumer: receives `rounds` rounds; dies without closing when `die`. */
static int consumer(const char* name, unsigned long long seed, int rounds, int die) {
  ferry_node_pool_t pool = open_pool(name, "consumer");
  ferry_handoff_t h = open_handoff(pool, 30, NULL);
  for (int r = 0; r < rounds; ++r) recv_round(h, seed, r);
  if (die) _exit(failures ? 1 : 0);
  ferry_handoff_stats_t st;
  st.struct_size = sizeof st;
  CHECK(ferry_handoff_get_stats(h, &st) == FERRY_SUCCESS);
  CHECK(st.received >= (uint64_t)rounds && st.pool_slots == st.received && st.peer_slots == 0 && st.pending == 0);
  CHECK(ferry_handoff_destroy(h) == FERRY_SUCCESS);
  CHECK(ferry_node_pool_destroy(pool) == FERRY_SUCCESS);
  return failures ? 1 : 0;
}

static pid_t spawn_consumer(const char* name, unsigned long long seed, int rounds, int die) {
  fflush(NULL);
  const pid_t pid = fork();
  if (pid == 0) _exit(consumer(name, seed, rounds, die));
  return pid;
}

static int exit_code(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void bit_exact_between_two_processes(unsigned long long seed) {
  char name[64];
  snprintf(name, sizeof name, "c-ho-%d-a", (int)getpid());
  const pid_t child = spawn_consumer(name, seed, ROUNDS, 0);
  ferry_node_pool_t pool = open_pool(name, "producer");
  ferry_handoff_t h = open_handoff(pool, 30, NULL);
  for (int r = 0; r < ROUNDS; ++r) CHECK(send_round(h, seed, r) == FERRY_SUCCESS);
  CHECK(ferry_handoff_drain(h, 30) == FERRY_SUCCESS);
  ferry_handoff_stats_t st;
  st.struct_size = sizeof st;
  CHECK(ferry_handoff_get_stats(h, &st) == FERRY_SUCCESS);
  CHECK(st.struct_size == sizeof st && st.sent >= ROUNDS && st.pending == 0 && st.peer_slots == 0);
  CHECK(exit_code(child) == 0);
  CHECK(ferry_handoff_destroy(h) == FERRY_SUCCESS);
  CHECK(ferry_handoff_destroy(h) == FERRY_ERROR_INVALID_ARGUMENT); /* a destroyed handle says so */
  CHECK(strstr(ferry_last_error(), "destroyed") != NULL);
  CHECK(ferry_node_pool_destroy(pool) == FERRY_SUCCESS);
}

static void a_consumer_that_dies_is_peer_gone_then_broken(unsigned long long seed) {
  char name[64];
  snprintf(name, sizeof name, "c-ho-%d-b", (int)getpid());
  const pid_t child = spawn_consumer(name, seed, 2, 1);
  ferry_node_pool_t pool = open_pool(name, "producer");
  ferry_handoff_t h = open_handoff(pool, 60, NULL);
  const time_t t0 = time(NULL);
  ferry_status_t s = FERRY_SUCCESS;
  for (int r = 0; r < 1000 && s == FERRY_SUCCESS; ++r) s = send_round(h, seed, r);
  CHECK(s == FERRY_ERROR_PEER_GONE);
  CHECK(strstr(ferry_last_error(), "left the pool") != NULL);
  CHECK(time(NULL) - t0 < 30); /* noticed by watching, not by the 60 s timeout */
  CHECK(exit_code(child) == 0);
  CHECK(send_round(h, seed, 0) == FERRY_ERROR_BROKEN);
  CHECK(strstr(ferry_last_error(), "is broken") != NULL);
  CHECK(ferry_handoff_destroy(h) == FERRY_SUCCESS);
  CHECK(ferry_node_pool_destroy(pool) == FERRY_SUCCESS);
}

static void a_consumer_that_never_comes_times_out(void) {
  char name[64];
  snprintf(name, sizeof name, "c-ho-%d-c", (int)getpid());
  ferry_node_pool_t pool = open_pool(name, "producer");
  ferry_handoff_t h = open_handoff(pool, 0.5, NULL);
  char item[100] = {0};
  const void* src = item;
  const uint64_t size = sizeof item;
  CHECK(ferry_handoff_send(h, &src, &size, 1, NULL) == FERRY_SUCCESS); /* one slot: no wait */
  const ferry_status_t s = ferry_handoff_drain(h, 0.5);
  CHECK(s == FERRY_ERROR_TIMEOUT);
  CHECK(strstr(ferry_last_error(), "it has not started: no recv call yet") != NULL);
  CHECK(strcmp(ferry_status_name(s), "FERRY_ERROR_TIMEOUT") == 0);
  CHECK(strcmp(ferry_status_name(FERRY_ERROR_PEER_GONE), "FERRY_ERROR_PEER_GONE") == 0);
  CHECK(strcmp(ferry_status_name(FERRY_ERROR_BROKEN), "FERRY_ERROR_BROKEN") == 0);
  CHECK(ferry_handoff_destroy(h) == FERRY_SUCCESS);
  CHECK(ferry_node_pool_destroy(pool) == FERRY_SUCCESS);
}

static void bad_arguments_are_refused(void) {
  char name[64];
  snprintf(name, sizeof name, "c-ho-%d-d", (int)getpid());
  ferry_node_pool_t pool = open_pool(name, "one");
  ferry_handoff_t h = NULL, other = NULL;
  ferry_handoff_options_t o;
  CHECK(ferry_handoff_options_init(&o) == FERRY_SUCCESS);
  o.slot_bytes = 4096;
  o.route = 7;
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &h) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "route=7") != NULL);
  ferry_handoff_options_t small; /* an older caller's struct: only its members are written */
  memset(&small, 0x5A, sizeof small);
  small.struct_size = 16;
  CHECK(ferry_handoff_options_defaults(&small) == FERRY_SUCCESS);
  CHECK(small.struct_size == 16 && small.slots == 4 && small.route == FERRY_HANDOFF_ROUTE_AUTO);
  CHECK(small.slot_bytes == 0x5A5A5A5A5A5A5A5Aull); /* beyond its struct_size: untouched */
  CHECK(ferry_handoff_options_defaults(NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  o.route = FERRY_HANDOFF_ROUTE_AUTO;
  o.peer_sms = -1;
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &h) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "peer_sms=-1") != NULL);
  o.peer_sms = 1025;
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &h) == FERRY_ERROR_INVALID_ARGUMENT);
  o.peer_sms = 0;
  o.reserved = 1;
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &h) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "reserved") != NULL);
  o.reserved = 0;
  o.timeout_s = -1;
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &h) == FERRY_ERROR_INVALID_ARGUMENT);
  o.timeout_s = NAN;
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &h) == FERRY_ERROR_INVALID_ARGUMENT);
  o.timeout_s = 5;
  o.slots = 0;
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &h) == FERRY_ERROR_INVALID_ARGUMENT);
  o.slots = 2;
  o.route = FERRY_HANDOFF_ROUTE_PEER; /* needs a GPU side */
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &h) == FERRY_ERROR_NOT_SUPPORTED);
  o.route = FERRY_HANDOFF_ROUTE_AUTO;
  CHECK(ferry_handoff_open(pool, "k", &o, -1, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_handoff_open(NULL, "k", &o, -1, &h) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &h) == FERRY_SUCCESS);
  o.slots = 3; /* the other side asks for other slots: both named */
  CHECK(ferry_handoff_open(pool, "k", &o, -1, &other) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "the other side opened it with slots=2") != NULL);
  CHECK(ferry_handoff_send(h, NULL, NULL, 1, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_handoff_send(h, NULL, NULL, 0, NULL) == FERRY_SUCCESS); /* nothing to move */
  ferry_handoff_stats_t st;
  st.struct_size = 3; /* not set properly */
  CHECK(ferry_handoff_get_stats(h, &st) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_handoff_destroy(h) == FERRY_SUCCESS);
  /* a GPU side: opens where there is a device, else says there is none (small
   * slots: the defaults, 4 x 64 MiB, do not fit this 4 MiB pool) */
  o.slots = 2;
  o.slot_bytes = 64 << 10;
  const ferry_status_t s = ferry_handoff_open(pool, "gpu", &o, 0, &h);
  CHECK(s == FERRY_SUCCESS || s == FERRY_ERROR_NO_DEVICE);
  if (s == FERRY_SUCCESS) CHECK(ferry_handoff_destroy(h) == FERRY_SUCCESS);
  CHECK(ferry_node_pool_destroy(pool) == FERRY_SUCCESS);
}

int main(void) {
  unsigned long long seed = (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 16);
  printf("handoff_test seed %llu\n", seed);
  bit_exact_between_two_processes(seed);
  a_consumer_that_dies_is_peer_gone_then_broken(seed);
  a_consumer_that_never_comes_times_out();
  bad_arguments_are_refused();
  printf("handoff_test: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
