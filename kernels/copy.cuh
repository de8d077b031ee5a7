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

// Thread g of stride threads copies its share of a segment into nd <= ND
// destinations (one load, nd stores), four units in flight at a time, the
// last round too (predicated): a pull over NVLink waits about a microsecond
// per load, so one load per thread at a time held a block to some 8 GB/s,
// and a mid-size op is only a few rounds per thread (the loads all come
// before the stores: the compiler may not reorder them itself, dst and src
// could alias).
template <class W, int ND>
__device__ __forceinline__ void gs_copy_units(char *const *dst, int nd, gs_u64 off, const char *src,
                                              gs_u64 units, gs_u64 g, gs_u64 stride) {
	const W *s = (const W *)(src + off);
	for (gs_u64 i = g; i < units; i += 4 * stride) {
		W v[4];
#pragma unroll
		for (int u = 0; u < 4; ++u)
			if (i + u * stride < units)
				v[u] = s[i + u * stride];
#pragma unroll
		for (int k = 0; k < ND; ++k)
			if (k < nd) {
				W *d = (W *)(dst[k] + off);
#pragma unroll
				for (int u = 0; u < 4; ++u)
					if (i + u * stride < units)
						d[i + u * stride] = v[u];
			}
	}
}

template <int ND>
__device__ __forceinline__ void gs_copy_bytes(char *const *dst, int nd, const char *src, gs_u64 lo,
                                              gs_u64 hi, gs_u64 g, gs_u64 stride) {
	for (gs_u64 i = lo + g; i < hi; i += stride) {
		const char v = src[i];
#pragma unroll
		for (int k = 0; k < ND; ++k)
			if (k < nd)
				dst[k][i] = v;
	}
}

// A segment of bytes from src into dst[0..nd), nd <= ND, in the widest
// access every destination is co-aligned with src for.
template <int ND>
__device__ __forceinline__ void gs_copy_seg_to(char *const *dst, int nd, const char *src, gs_u64 bytes,
                                               gs_u64 g, gs_u64 stride) {
	gs_u64 x = 0;
#pragma unroll
	for (int k = 0; k < ND; ++k)
		if (k < nd)
			x |= ((gs_u64)dst[k] ^ (gs_u64)src) & 15u;
	const gs_u64 w = x == 0 ? 16u : (x & (~x + 1u)); // lowest set bit
	gs_u64 head = (w - ((gs_u64)src & (w - 1u))) & (w - 1u);
	head = head < bytes ? head : bytes;
	const gs_u64 units = (bytes - head) / w, tail = head + units * w;
	gs_copy_bytes<ND>(dst, nd, src, 0, head, g, stride);
	switch (w) {
	case 16:
		gs_copy_units<gs_v16, ND>(dst, nd, head, src, units, g, stride);
		break;
	case 8:
		gs_copy_units<gs_u64, ND>(dst, nd, head, src, units, g, stride);
		break;
	case 4:
		gs_copy_units<gs_u32, ND>(dst, nd, head, src, units, g, stride);
		break;
	case 2:
		gs_copy_units<unsigned short, ND>(dst, nd, head, src, units, g, stride);
		break;
	default:
		gs_copy_bytes<ND>(dst, nd, src, head, tail, g, stride);
	}
	gs_copy_bytes<ND>(dst, nd, src, tail, bytes, g, stride);
}

__device__ __forceinline__ void gs_copy_seg(char *dst, const char *src, gs_u64 bytes, gs_u64 g,
                                            gs_u64 stride) {
	char *const d[1] = {dst};
	gs_copy_seg_to<1>(d, 1, src, bytes, g, stride);
}

#endif // GOSYM_COPY_CUH
