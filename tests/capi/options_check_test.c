/* options_check_test.c — ferry_options_check in one environment per process
 * (options are read once per process, so each case is its own CTest run).
 *
 * Usage: ferry_options_check_test CASE, where CASE is one of the cases below.
 * The program first removes every FERRY_* variable it inherited, then sets the
 * case's own, then makes its first ferry call. A good environment passes the
 * check and its values reach the defaults; a bad one (unknown key, bad value,
 * value out of range) fails the check with FERRY_ERROR_INVALID_ARGUMENT quoting
 * the culprit, fails again the same way on a second check (the failure is
 * remembered), and fails every call that needs options, while calls that need
 * none still work. Exit 0: passed; 1: failed (the reasons on stderr). */
#define _XOPEN_SOURCE 700 /* putenv, unsetenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"

extern char** environ;

typedef struct check_case {
  const char* name;
  const char* env[3];         /* NAME=VALUE, NULL-terminated */
  ferry_status_t status;      /* of ferry_options_check */
  const char* quote[2];       /* what the message must contain (NULL: nothing) */
  size_t chunk_bytes;         /* good cases: ferry_pool_options_init's chunk_bytes */
} check_case_t;

static const check_case_t kCases[] = {
    {"clean", {NULL}, FERRY_SUCCESS, {NULL, NULL}, (size_t)64 << 20},
    {"good-values", {"FERRY_CHUNK_SIZE=128MiB", "FERRY_COPY_STRATEGY=staged", NULL}, FERRY_SUCCESS,
     {NULL, NULL}, (size_t)128 << 20},
    {"unknown-key", {"FERRY_NO_SUCH_OPTION=7", NULL}, FERRY_ERROR_INVALID_ARGUMENT,
     {"FERRY_NO_SUCH_OPTION", "ferry options"}, 0},
    {"bad-size", {"FERRY_CHUNK_SIZE=banana", NULL}, FERRY_ERROR_INVALID_ARGUMENT, {"FERRY_CHUNK_SIZE", "banana"}, 0},
    {"bad-choice", {"FERRY_COPY_STRATEGY=fastest", NULL}, FERRY_ERROR_INVALID_ARGUMENT,
     {"FERRY_COPY_STRATEGY", "fastest"}, 0},
    {"out-of-range", {"FERRY_COPY_WORKERS=5000", NULL}, FERRY_ERROR_INVALID_ARGUMENT, {"FERRY_COPY_WORKERS", "5000"},
     0},
};

static int failures = 0;

static void fail(const char* case_name, const char* what) {
  fprintf(stderr, "options_check_test %s: %s (last error: \"%s\")\n", case_name, what, ferry_last_error());
  ++failures;
}

/* Removes every inherited FERRY_* variable (environ changes under unsetenv:
 * start over after each). */
static void clear_ferry_environment(void) {
  for (;;) {
    char name[256] = {0};
    for (char** e = environ; e && *e; ++e) {
      const char* eq = strchr(*e, '=');
      if (strncmp(*e, "FERRY_", 6) == 0 && eq && (size_t)(eq - *e) < sizeof name) {
        memcpy(name, *e, (size_t)(eq - *e));
        break;
      }
    }
    if (!name[0]) return;
    unsetenv(name);
  }
}

static int contains_quotes(const check_case_t* c) {
  for (int i = 0; i < 2; ++i)
    if (c->quote[i] && !strstr(ferry_last_error(), c->quote[i])) return 0;
  return 1;
}

static void run(const check_case_t* c) {
  const ferry_status_t first = ferry_options_check();
  if (first != c->status) fail(c->name, "ferry_options_check returned an unexpected status");
  if (!contains_quotes(c)) fail(c->name, "the message does not quote the culprit");
  char message[1024];
  snprintf(message, sizeof message, "%s", ferry_last_error());
  if (ferry_options_check() != first) fail(c->name, "a second ferry_options_check answered differently");
  if (strcmp(message, ferry_last_error()) != 0) fail(c->name, "a second check gave another message");

  int major = 0, minor = 0; /* needs no options: works in any environment */
  if (ferry_get_api_version(&major, &minor) != FERRY_SUCCESS || major != FERRY_API_MAJOR)
    fail(c->name, "ferry_get_api_version failed");

  ferry_pool_options_t o;
  memset(&o, 0, sizeof o);
  const ferry_status_t defaults = ferry_pool_options_init(&o);
  ferry_pool_t pool = NULL;
  const ferry_status_t created = ferry_pool_create(NULL, &pool);
  if (c->status == FERRY_SUCCESS) {
    if (defaults != FERRY_SUCCESS) fail(c->name, "ferry_pool_options_init failed");
    if (o.chunk_bytes != c->chunk_bytes) fail(c->name, "chunk_bytes is not the environment's value");
    if (created != FERRY_SUCCESS || !pool) fail(c->name, "ferry_pool_create failed");
    void* p = NULL;
    if (pool && (ferry_pool_alloc(pool, 12345, 0, FERRY_HUGE_AUTO, &p) != FERRY_SUCCESS ||
                 ferry_pool_free(pool, p) != FERRY_SUCCESS || ferry_pool_destroy(pool) != FERRY_SUCCESS))
      fail(c->name, "a pool made from the environment's options does not work");
  } else {
    if (defaults != c->status || !contains_quotes(c))
      fail(c->name, "ferry_pool_options_init did not refuse the bad environment, quoting it");
    if (created != c->status || pool != NULL || !contains_quotes(c))
      fail(c->name, "ferry_pool_create did not refuse the bad environment, quoting it");
  }
}

int main(int argc, char** argv) {
  const size_t n = sizeof kCases / sizeof kCases[0];
  if (argc != 2) {
    fprintf(stderr, "usage: %s CASE   (cases:", argv[0]);
    for (size_t i = 0; i < n; ++i) fprintf(stderr, " %s", kCases[i].name);
    fprintf(stderr, ")\n");
    return 2;
  }
  for (size_t i = 0; i < n; ++i) {
    if (strcmp(argv[1], kCases[i].name) != 0) continue;
    clear_ferry_environment();
    for (const char* const* kv = kCases[i].env; *kv; ++kv) putenv((char*)*kv);
    run(&kCases[i]);
    if (!failures) printf("options_check_test %s: passed\n", kCases[i].name);
    return failures ? 1 : 0;
  }
  fprintf(stderr, "%s: unknown case '%s'\n", argv[0], argv[1]);
  return 2;
}
