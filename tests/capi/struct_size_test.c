/* struct_size_test.c — ferry.h's structs grow without breaking callers (the rule
 * at the top of ferry.h), tested from C, the language of the header.
 *
 * A caller built against an older ferry.h passes structs without the members a
 * later header added; here each "old_*" struct is the current one without its
 * last member(s), placed in a buffer whose bytes after it are poisoned. The
 * library must read only the caller's members (defaults for the rest: the
 * poison would be refused or misread), write only within the caller's size
 * (the poison stays), and report the bytes it filled in struct_size. A struct
 * from a newer header (larger) is accepted; a struct_size that was not set is
 * refused with a message. Without a GPU, the channel's options are still read
 * before the missing device is reported. Exit status 0: passed; 1: failed.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"

static int failures = 0;

#define CHECK(cond)                                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; ferry_last_error: %s\n", __FILE__, __LINE__, #cond, \
              ferry_last_error());                                                               \
      ++failures;                                                                                \
    }                                                                                            \
  } while (0)

#define POISON 0xAB
#define MiB ((size_t)1 << 20)

/* An older ferry.h's structs: the current ones without their last member(s). */
typedef struct old_pool_options { /* no target_bytes */
  size_t struct_size;
  size_t chunk_bytes;
  int memfd;
  ferry_huge_policy_t huge_pages;
  size_t limit_bytes;
  int zero_recycled;
  int touch_threads;
  int64_t release_delay_ms;
  size_t release_batch_bytes;
  int numa_node;
} old_pool_options_t;

typedef struct old_pool_stats { /* no note_count */
  size_t struct_size;
  ferry_pool_kind_stats_t small, huge;
  uint64_t allocations, frees, recycles, chunk_reservations, chunk_releases, fallbacks;
  uint64_t touch_ns, register_ns;
  uint64_t chunks_small_pages, chunks_thp, chunks_hugetlb_2m, chunks_hugetlb_1g;
} old_pool_stats_t;

typedef struct old_channel_options { /* no use_gdrcopy, reserved */
  size_t struct_size;
  uint32_t idle_us, slots, timeout_ms, spin_us;
} old_channel_options_t;

typedef struct old_channel_stats { /* no gdrcopy_writes */
  size_t struct_size;
  uint64_t requests, launches, idle_exits;
} old_channel_stats_t;

typedef struct old_managed_stats { /* no reuse_after_fence, reuse_by_wait */
  size_t struct_size;
  uint64_t allocated, allocated_peak, requested, reserved, reserved_peak, allocations, frees, failures;
  uint64_t prefetched_bytes, prefetches, chunks, reuse_same_stream;
} old_managed_stats_t;

typedef struct old_versions { /* no cuda_runtime, cuda_driver */
  size_t struct_size;
  int api_major, api_minor;
  char library[32];
} old_versions_t;

/* A struct of `size` bytes followed by 256 poisoned bytes, zeroed. */
static unsigned char* poisoned(size_t size) {
  unsigned char* b = malloc(size + 256);
  if (!b) abort();
  memset(b, 0, size);
  memset(b + size, POISON, 256);
  return b;
}

static int poison_intact(const unsigned char* b, size_t size) {
  for (size_t i = size; i < size + 256; ++i)
    if (b[i] != POISON) return 0;
  return 1;
}

static int has(const char* haystack, const char* needle) { return strstr(haystack, needle) != NULL; }

static void test_layouts_only_grow(void) {
  /* The old layouts are prefixes of the current ones, ending where the next member starts. */
  CHECK(sizeof(old_pool_options_t) == offsetof(ferry_pool_options_t, target_bytes));
  CHECK(sizeof(old_pool_stats_t) == offsetof(ferry_pool_stats_t, note_count));
  CHECK(sizeof(old_channel_options_t) == offsetof(ferry_channel_options_t, use_gdrcopy));
  CHECK(sizeof(old_channel_stats_t) == offsetof(ferry_channel_stats_t, gdrcopy_writes));
  CHECK(sizeof(old_managed_stats_t) == offsetof(ferry_managed_stats_t, reuse_after_fence));
  CHECK(sizeof(old_versions_t) == offsetof(ferry_versions_t, cuda_runtime));
  CHECK(sizeof(ferry_pool_options_t) % 8 == 0 && sizeof(ferry_channel_options_t) % 8 == 0);
  int major = 0, minor = 0;
  CHECK(ferry_get_api_version(&major, &minor) == FERRY_SUCCESS);
  CHECK(major == FERRY_API_MAJOR && minor == FERRY_API_MINOR && minor >= 1);
}

static void test_old_pool_options_and_stats(void) {
  /* Defaults for an old struct fill only its members. */
  unsigned char* raw = poisoned(sizeof(old_pool_options_t));
  old_pool_options_t* o = (old_pool_options_t*)raw;
  o->struct_size = sizeof *o;
  CHECK(ferry_pool_options_defaults((ferry_pool_options_t*)o) == FERRY_SUCCESS);
  CHECK(o->struct_size == sizeof *o);
  CHECK(o->chunk_bytes >= 2 * MiB && o->chunk_bytes % (2 * MiB) == 0);
  CHECK(poison_intact(raw, sizeof *o));

  /* The pool takes the old struct's members; target_bytes (poisoned: a huge
   * reservation if it were read) keeps its default, 0. */
  o->chunk_bytes = 4 * MiB;
  o->huge_pages = FERRY_HUGE_POLICY_OFF;
  o->zero_recycled = 1;
  ferry_pool_t pool = NULL;
  CHECK(ferry_pool_create((const ferry_pool_options_t*)o, &pool) == FERRY_SUCCESS);
  if (!pool) {
    free(raw);
    return;
  }
  size_t n = MiB + 4093; /* odd size */
  unsigned char* p = NULL;
  CHECK(ferry_pool_alloc(pool, n, 0, FERRY_HUGE_AUTO, (void**)&p) == FERRY_SUCCESS);
  if (p) {
    srand(12345);
    unsigned char* want = malloc(n);
    for (size_t i = 0; i < n; ++i) want[i] = (unsigned char)rand();
    memcpy(p, want, n);
    CHECK(memcmp(p, want, n) == 0);
    free(want);
  }

  unsigned char* sraw = poisoned(sizeof(old_pool_stats_t));
  old_pool_stats_t* s = (old_pool_stats_t*)sraw;
  s->struct_size = sizeof *s;
  CHECK(ferry_pool_get_stats(pool, (ferry_pool_stats_t*)s) == FERRY_SUCCESS);
  CHECK(s->struct_size == sizeof *s);
  CHECK(s->allocations == 1 && s->chunk_reservations == 1);
  CHECK(s->small.reserved.current == 4 * MiB); /* the old struct's chunk_bytes, no target reserved */
  CHECK(poison_intact(sraw, sizeof *s));       /* note_count was not written */

  /* The current struct, and one from a newer header (64 bytes more). */
  ferry_pool_stats_t now;
  memset(&now, 0, sizeof now);
  now.struct_size = sizeof now;
  CHECK(ferry_pool_get_stats(pool, &now) == FERRY_SUCCESS);
  CHECK(now.struct_size == sizeof now && now.allocations == 1 && now.small.reserved.current == 4 * MiB);
  unsigned char* newer = poisoned(sizeof(ferry_pool_stats_t) + 64);
  ((ferry_pool_stats_t*)newer)->struct_size = sizeof(ferry_pool_stats_t) + 64;
  memset(newer + sizeof(ferry_pool_stats_t), POISON, 64);
  CHECK(ferry_pool_get_stats(pool, (ferry_pool_stats_t*)newer) == FERRY_SUCCESS);
  CHECK(((ferry_pool_stats_t*)newer)->struct_size == sizeof(ferry_pool_stats_t)); /* bytes filled */
  CHECK(poison_intact(newer, sizeof(ferry_pool_stats_t)));                       /* the unknown tail */

  if (p) CHECK(ferry_pool_free(pool, p) == FERRY_SUCCESS);
  CHECK(ferry_pool_destroy(pool) == FERRY_SUCCESS);
  free(newer);
  free(sraw);
  free(raw);
}

static void test_newer_options_are_accepted(void) {
  unsigned char* raw = poisoned(sizeof(ferry_pool_options_t) + 16);
  ferry_pool_options_t* o = (ferry_pool_options_t*)raw;
  CHECK(ferry_pool_options_init(o) == FERRY_SUCCESS);
  CHECK(o->struct_size == sizeof *o);
  o->struct_size = sizeof *o + 16; /* members this library does not know: ignored */
  ferry_pool_t pool = NULL;
  CHECK(ferry_pool_create(o, &pool) == FERRY_SUCCESS);
  if (pool) CHECK(ferry_pool_destroy(pool) == FERRY_SUCCESS);
  free(raw);
}

static void test_unset_struct_size_is_refused(void) {
  const size_t bad[] = {0, 7, 12, 4104, (size_t)-8};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    ferry_pool_options_t o;
    CHECK(ferry_pool_options_init(&o) == FERRY_SUCCESS);
    o.struct_size = bad[i];
    ferry_pool_t pool = NULL;
    CHECK(ferry_pool_create(&o, &pool) == FERRY_ERROR_INVALID_ARGUMENT && pool == NULL);
    CHECK(has(ferry_last_error(), "options->struct_size="));
    CHECK(ferry_pool_options_defaults(&o) == FERRY_ERROR_INVALID_ARGUMENT);
    ferry_versions_t v;
    memset(&v, POISON, sizeof v);
    v.struct_size = bad[i];
    CHECK(ferry_get_versions(&v) == FERRY_ERROR_INVALID_ARGUMENT);
    CHECK(has(ferry_last_error(), "out->struct_size=") && v.api_major != FERRY_API_MAJOR);
    ferry_managed_stats_t m;
    m.struct_size = bad[i];
    CHECK(ferry_managed_get_stats("managed", -1, &m) == FERRY_ERROR_INVALID_ARGUMENT);
  }
}

static void test_old_versions_and_managed_stats(void) {
  unsigned char* raw = poisoned(sizeof(old_versions_t));
  old_versions_t* v = (old_versions_t*)raw;
  v->struct_size = sizeof *v;
  CHECK(ferry_get_versions((ferry_versions_t*)v) == FERRY_SUCCESS);
  CHECK(v->struct_size == sizeof *v && v->api_major == FERRY_API_MAJOR && v->api_minor == FERRY_API_MINOR);
  CHECK(strlen(v->library) > 0 && strlen(v->library) < sizeof v->library);
  CHECK(poison_intact(raw, sizeof *v));
  free(raw);

  raw = poisoned(sizeof(old_managed_stats_t));
  old_managed_stats_t* m = (old_managed_stats_t*)raw;
  m->struct_size = sizeof *m;
  memset(raw + sizeof(size_t), POISON, sizeof *m - sizeof(size_t));
  CHECK(ferry_managed_get_stats("managed", -1, (ferry_managed_stats_t*)m) == FERRY_SUCCESS);
  CHECK(m->struct_size == sizeof *m);
  CHECK(m->allocations != 0xABABABABABABABABull && m->reuse_same_stream != 0xABABABABABABABABull); /* written */
  CHECK(m->frees <= m->allocations && m->allocated <= m->allocated_peak);
  CHECK(poison_intact(raw, sizeof *m));
  free(raw);
}

static void test_old_channel_options(void) {
  unsigned char* raw = poisoned(sizeof(old_channel_options_t));
  old_channel_options_t* o = (old_channel_options_t*)raw;
  o->struct_size = sizeof *o;
  CHECK(ferry_channel_options_defaults((ferry_channel_options_t*)o) == FERRY_SUCCESS);
  CHECK(o->idle_us == 200 && o->slots == 8 && o->struct_size == sizeof *o);
  CHECK(poison_intact(raw, sizeof *o));
  o->idle_us = 150;
  /* use_gdrcopy and reserved lie in the poison: read, they would be refused
   * (use_gdrcopy must be 0 or 1, reserved 0). */
  ferry_channel_t ch = NULL;
  int count = 0;
  const int have_device = ferry_device_count(&count) == FERRY_SUCCESS && count > 0;
  ferry_status_t st = ferry_channel_create_v2((const ferry_channel_options_t*)o, 0, &ch);
  CHECK(st == (have_device ? FERRY_SUCCESS : FERRY_ERROR_NO_DEVICE));
  if (ch) {
    double us = 0;
    CHECK(ferry_channel_ping(ch, &us) == FERRY_SUCCESS && us > 0);
    unsigned char* sraw = poisoned(sizeof(old_channel_stats_t));
    old_channel_stats_t* s = (old_channel_stats_t*)sraw;
    s->struct_size = sizeof *s;
    CHECK(ferry_channel_get_stats(ch, (ferry_channel_stats_t*)s) == FERRY_SUCCESS);
    CHECK(s->struct_size == sizeof *s && s->requests == 1 && s->launches == 1);
    CHECK(poison_intact(sraw, sizeof *s));
    free(sraw);
    CHECK(ferry_channel_destroy(ch) == FERRY_SUCCESS);
  }
  /* The current struct: reserved must be 0. */
  ferry_channel_options_t full;
  CHECK(ferry_channel_options_init(&full) == FERRY_SUCCESS && full.struct_size == sizeof full);
  full.reserved = 1;
  ch = NULL;
  CHECK(ferry_channel_create_v2(&full, 0, &ch) == FERRY_ERROR_INVALID_ARGUMENT && ch == NULL);
  CHECK(has(ferry_last_error(), "reserved=1"));
  free(raw);
}

static void test_managed_kinds(void) {
  const ferry_managed_kind_t kinds[] = {FERRY_MANAGED_DEVICE, FERRY_MANAGED_MANAGED, FERRY_MANAGED_MANAGED_POOL};
  const char* names[] = {"device", "managed", "managed_pool"};
  for (int i = 0; i < 3; ++i) {
    CHECK(ferry_managed_kind_name(kinds[i]) && strcmp(ferry_managed_kind_name(kinds[i]), names[i]) == 0);
    ferry_managed_kind_t k = (ferry_managed_kind_t)99;
    CHECK(ferry_managed_kind_from_name(names[i], &k) == FERRY_SUCCESS && k == kinds[i]);
  }
  CHECK(ferry_managed_kind_name((ferry_managed_kind_t)3) == NULL);
  CHECK(ferry_managed_kind_name((ferry_managed_kind_t)-1) == NULL);
  ferry_managed_kind_t k;
  CHECK(ferry_managed_kind_from_name("managed-pool", &k) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(has(ferry_last_error(), "'managed-pool'"));
  CHECK(ferry_managed_kind_from_name(NULL, &k) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_managed_kind_from_name("device", NULL) == FERRY_ERROR_INVALID_ARGUMENT);
}

int main(void) {
  test_layouts_only_grow();
  test_old_pool_options_and_stats();
  test_newer_options_are_accepted();
  test_unset_struct_size_is_refused();
  test_old_versions_and_managed_stats();
  test_old_channel_options();
  test_managed_kinds();
  if (failures) {
    fprintf(stderr, "struct_size_test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("struct_size_test: passed\n");
  return 0;
}
