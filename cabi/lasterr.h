#ifndef GOSYM_LASTERR_H
#define GOSYM_LASTERR_H
#include <stddef.h>
__attribute__((visibility("hidden"))) void gosym_set_last_error(const char *msg, size_t n);
__attribute__((visibility("hidden"))) char *gosym_get_last_error(void);
#endif
