/*
 * Both headers in one translation unit: the compiler then rejects any gosym_*
 * function that they declare with different types. scripts/check_abi.py falls
 * back to comparing normalized prototypes when cgo's spelling (no const) keeps
 * them from sharing a unit.
 */
#include "gosym.h"
#include "libgosym.h"

int both_headers_compile(void);
int both_headers_compile(void) { return 0; }
