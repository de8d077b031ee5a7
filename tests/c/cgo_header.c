/* The cgo-generated header (python/gosym/libgosym.h) must compile on its own. */
#include "libgosym.h"

int cgo_header_compiles(void);
int cgo_header_compiles(void) { return 0; }
