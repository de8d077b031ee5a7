package cuda

/*
#include <dlfcn.h>
#include "dispatch.h"

typedef CUresult (*gscu_ctx_sync_fn)(void);

// cuCtxSynchronize takes no argument, which the X-macro table cannot
// express; it is looked up here, on demand, by its stable export name.
static inline CUresult gscu_ctx_synchronize(const gscu_driver *t, void *lib, CUcontext ctx) {
	if (!lib)
		return GSCU_ERROR_NO_SYMBOL;
	gscu_ctx_sync_fn f = (gscu_ctx_sync_fn)dlsym(lib, "cuCtxSynchronize");
	if (!f)
		return GSCU_ERROR_NO_SYMBOL;
	CUcontext prev;
	CUresult r = gscu_ctx_enter(t, ctx, &prev);
	if (r != GSCU_SUCCESS)
		return r;
	r = f();
	gscu_ctx_leave(t, ctx, prev);
	return r;
}
*/
import "C"

// CtxSynchronize blocks until every stream of ctx is idle. Teardown uses
// it before unmapping memory that kernels on the caller's streams may still
// read; the fake driver has no library and reports ErrNotSupported.
func (d *Driver) CtxSynchronize(ctx Context) error {
	return d.check("cuCtxSynchronize", C.gscu_ctx_synchronize(d.t, d.lib, cCtx(ctx)))
}
