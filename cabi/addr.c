#include "addr.h"

void *gsabi_addr_ptr(uint64_t addr) { return (void *)(uintptr_t)addr; }
