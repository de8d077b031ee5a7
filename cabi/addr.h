// A device address as a C pointer, for exports whose callers (torch's
// pluggable allocator) take void *: Go may not make a pointer of an integer.
#ifndef GOSYM_ADDR_H
#define GOSYM_ADDR_H
#include <stdint.h>
void *gsabi_addr_ptr(uint64_t addr);
#endif
