// Byte copies shared by the data movement kernels (copy.cu, p2p.cu): the
// widest access (16/8/4/2/1 bytes) that dst and src are co-aligned for,
// with byte heads and tails, spread over the threads of a launch or block.
#ifndef GOSYM_COPY_CUH
#define GOSYM_COPY_CUH

#include "common.cuh"

// One of parts equal shares of n bytes, rounded up to 16 (the last share may
// be short or empty): the same answer wherever a byte range is split alike.
__device__ __forceinline__ gs_u64 gs_share16(gs_u64 n, gs_u64 parts) {
	return ((n + parts - 1) / parts + 15u) / 16u * 16u;
}

// Thread g of stride threads copies its share of a segment, four units in
// flight at a time: a pull over NVLink waits about a microsecond per load,
// so one load per thread at a time held a block to some 8 GB/s (the loads
// all come before the stores: the compiler may not reorder them itself, dst
// and src could alias).
template <class W>
__device__ __forceinline__ void gs_copy_units(char *dst, const char *src, gs_u64 units, gs_u64 g,
                                              gs_u64 stride) {
	W *d = (W *)dst;
	const W *s = (const W *)src;
	gs_u64 i = g;
	for (; i + 3 * stride < units; i += 4 * stride) {
		const W a = s[i], b = s[i + stride], c = s[i + 2 * stride], e = s[i + 3 * stride];
		d[i] = a;
		d[i + stride] = b;
		d[i + 2 * stride] = c;
		d[i + 3 * stride] = e;
	}
	for (; i < units; i += stride)
		d[i] = s[i];
}

__device__ __forceinline__ void gs_copy_bytes(char *dst, const char *src, gs_u64 lo, gs_u64 hi,
                                              gs_u64 g, gs_u64 stride) {
	for (gs_u64 i = lo + g; i < hi; i += stride)
		dst[i] = src[i];
}

__device__ __forceinline__ void gs_copy_seg(char *dst, const char *src, gs_u64 bytes, gs_u64 g,
                                            gs_u64 stride) {
	const gs_u64 x = ((gs_u64)dst ^ (gs_u64)src) & 15u;
	const gs_u64 w = x == 0 ? 16u : (x & (~x + 1u)); // lowest set bit
	gs_u64 head = (w - ((gs_u64)dst & (w - 1u))) & (w - 1u);
	head = head < bytes ? head : bytes;
	const gs_u64 units = (bytes - head) / w, tail = head + units * w;
	gs_copy_bytes(dst, src, 0, head, g, stride);
	switch (w) {
	case 16:
		gs_copy_units<gs_v16>(dst + head, src + head, units, g, stride);
		break;
	case 8:
		gs_copy_units<gs_u64>(dst + head, src + head, units, g, stride);
		break;
	case 4:
		gs_copy_units<gs_u32>(dst + head, src + head, units, g, stride);
		break;
	case 2:
		gs_copy_units<unsigned short>(dst + head, src + head, units, g, stride);
		break;
	default:
		gs_copy_bytes(dst + head, src + head, 0, units, g, stride);
	}
	gs_copy_bytes(dst, src, tail, bytes, g, stride);
}

#endif // GOSYM_COPY_CUH
