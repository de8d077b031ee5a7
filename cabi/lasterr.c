// Thread-local last-error text for the C ABI. Go sets it from inside an
// export, which runs on the caller's thread, so each calling thread sees
// its own last error.
#include <stdlib.h>
#include <string.h>

#include "lasterr.h"

static __thread char *last_error;

void gosym_set_last_error(const char *msg, size_t n) {
  char *p = realloc(last_error, n + 1);
  if (p == NULL) {
    return;
  }
  memcpy(p, msg, n);
  p[n] = '\0';
  last_error = p;
}

char *gosym_get_last_error(void) { return last_error ? last_error : (char *)""; }
