/* CPU reduction kernels of the host data plane (see reduce.go). Internal to
 * package host: nothing here is part of the public C ABI (cabi/gosym.h). */
#ifndef GOSYM_HOST_REDUCE_H
#define GOSYM_HOST_REDUCE_H

#include <stddef.h>
#include <stdint.h>

/* Not exported from libgosym.so. */
#pragma GCC visibility push(hidden)

/* Status codes of gshost_reduce. */
#define GSHOST_OK 0
#define GSHOST_EUNSUPPORTED 1 /* (dtype, op) has no kernel */

/* dst[i] = op(srcs[0][i], ..., srcs[k-1][i]) for i < n, combined left to
 * right. dtype and op use the GOSYM_DTYPE_* / GOSYM_RED_* numbering. srcs is
 * read only during the call and never retained. */
int gshost_reduce(uintptr_t dst, const uintptr_t *srcs, int k, size_t n,
                  int dtype, int op, double scale);

/* Which kernel set gshost_reduce uses: 0 picks by CPU (the default), 1 forces
 * the baseline kernels. Returns the name of the set now in use. Tests only. */
const char *gshost_reduce_select(int force_generic);

/* Element conversions as the kernels do them, exposed for tests. */
void gshost_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void gshost_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void gshost_f16_to_f32(float *dst, const uint16_t *src, size_t n);
void gshost_bf16_to_f32(float *dst, const uint16_t *src, size_t n);

#pragma GCC visibility pop

#endif
