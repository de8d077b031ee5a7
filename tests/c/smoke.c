/*
 * C smoke test of libgosym.so through the hand-written header only, as a C
 * caller would use it: version handshake, error reporting on bad handles,
 * and the thread-locality of gosym_last_error().
 */
#include "gosym.h"

#include <stdio.h>
#include <string.h>
#include <threads.h>

static int failures;
static int checks;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    checks++;                                                                  \
    if (!(cond)) {                                                             \
      failures++;                                                              \
      fprintf(stderr, "smoke: FAIL %s:%d: ", __FILE__, __LINE__);              \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
    }                                                                          \
  } while (0)

/* Copies the current thread's last error, so later calls cannot change it. */
static void last_error(char *buf, size_t cap) {
  const char *msg = gosym_last_error();
  snprintf(buf, cap, "%s", msg ? msg : "");
}

/* An invalid-handle call must fail cleanly and say why. */
static void expect_invalid_handle(const char *what, int32_t rc) {
  char msg[512];
  last_error(msg, sizeof msg);
  CHECK(rc == GOSYM_ERR_INVALID_HANDLE, "%s returned %d, want %d", what,
        (int)rc, GOSYM_ERR_INVALID_HANDLE);
  CHECK(msg[0] != '\0', "%s: gosym_last_error() is empty", what);
}

/* Runs on a second thread: makes an error of its own. */
static int other_thread(void *arg) {
  char *out = arg;
  int32_t rc = gosym_endpoint_destroy(0);
  last_error(out, 512);
  return rc;
}

int main(void) {
  uint32_t abi = gosym_abi_version();
  CHECK(abi == GOSYM_ABI_VERSION, "gosym_abi_version() = %u, header has %u",
        (unsigned)abi, (unsigned)GOSYM_ABI_VERSION);

  char version[128];
  memset(version, 'x', sizeof version);
  int32_t rc = gosym_version(version, sizeof version);
  CHECK(rc == GOSYM_OK, "gosym_version returned %d", (int)rc);
  CHECK(memchr(version, '\0', sizeof version) != NULL && version[0] != '\0',
        "gosym_version wrote no NUL-terminated string");

  expect_invalid_handle("gosym_work_wait(0, 0)", gosym_work_wait(0, 0));
  expect_invalid_handle("gosym_work_test(0)", gosym_work_test(0));
  expect_invalid_handle("gosym_work_release(0)", gosym_work_release(0));
  expect_invalid_handle("gosym_work_finish(0, 0)", gosym_work_finish(0, 0));
  expect_invalid_handle("gosym_op_run(0, NULL)", gosym_op_run(0, NULL));
  expect_invalid_handle("gosym_cuda_free(0)", gosym_cuda_free(0));
  expect_invalid_handle("gosym_view_release(0)", gosym_view_release(0));
  expect_invalid_handle("gosym_endpoint_device_error(0)", gosym_endpoint_device_error(0));
  {
    uint64_t buf = 0, addr = 0, size = 0, view = 0, stride = 0;
    CHECK(gosym_cuda_alloc(-1, 4096, &buf, &addr, &size) == GOSYM_ERR_INVALID_ARG,
          "gosym_cuda_alloc on device -1 must be an invalid argument");
    expect_invalid_handle("gosym_contiguous_view(0, ...)",
                          gosym_contiguous_view(0, 0, 0, &view, &addr, &stride));
  }
  expect_invalid_handle("gosym_endpoint_destroy(0)",
                        gosym_endpoint_destroy(0));
  /* A handle that was never issued is as invalid as 0. */
  expect_invalid_handle("gosym_work_wait(~0, 0)",
                        gosym_work_wait(UINT64_MAX, 0));

  /* The error text belongs to the thread that made it. */
  rc = gosym_work_wait(0, 0);
  char mine[512], theirs[512], after[512];
  last_error(mine, sizeof mine);
  thrd_t t;
  int trc = -1;
  CHECK(thrd_create(&t, other_thread, theirs) == thrd_success,
        "thrd_create failed");
  CHECK(thrd_join(t, &trc) == thrd_success, "thrd_join failed");
  CHECK(trc == GOSYM_ERR_INVALID_HANDLE,
        "gosym_endpoint_destroy(0) on another thread returned %d", trc);
  CHECK(theirs[0] != '\0', "the other thread's last error is empty");
  last_error(after, sizeof after);
  CHECK(strcmp(mine, after) == 0,
        "another thread changed this thread's last error: \"%s\" -> \"%s\"",
        mine, after);

  printf("smoke: abi %u, engine %s\n", (unsigned)abi, version);
  printf("smoke: %d passed, %d failed\n", checks - failures, failures);
  return failures == 0 ? 0 : 1;
}
