// tether KV-copy kernels: gather paged (block, layer, plane) chunks into a contiguous
// staging buffer and scatter them back. A copy is type-agnostic, so the kernels move
// raw bytes and need no CUDA headers; NVRTC compiles them with no toolkit installed.
//
// Addressing (identical to ChunkMap in engine-ext/kvcopy/src/layout.rs):
//   work item  = ((entry * num_layers + layer) * planes + plane), one chunk each
//   cache addr = layer_base[layer] + plane * plane_stride + blocks[entry] * block_stride
//   staging    = staging + item * chunk_bytes
// One thread block copies one chunk at a time, grid-strided over all items, so the
// host bounds the number of resident CTAs (and thus SMs used) by the grid size.
// Block ids are validated on the host before launch.

typedef unsigned long long u64;
typedef unsigned int u32;

struct alignas(16) Vec16 {
    u32 x, y, z, w;
};

// Streaming (evict-first) 16-byte accesses: the copied data is not reused soon.
__device__ __forceinline__ Vec16 load16(const Vec16* p) {
    Vec16 v;
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void store16(Vec16* p, Vec16 v) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// Copies `bytes` with 16-byte vectors when both ends are 16-byte aligned (four loads in
// flight per thread), and a byte loop for the tail or for unaligned chunks.
__device__ __forceinline__ void copy_chunk(unsigned char* dst, const unsigned char* src, u64 bytes) {
    const u64 tid = threadIdx.x;
    const u64 step = blockDim.x;
    u64 done = 0;
    if (((reinterpret_cast<u64>(dst) | reinterpret_cast<u64>(src)) & 15ull) == 0) {
        const u64 nvec = bytes >> 4;
        const Vec16* s = reinterpret_cast<const Vec16*>(src);
        Vec16* d = reinterpret_cast<Vec16*>(dst);
        u64 i = tid;
        for (; i + 3 * step < nvec; i += 4 * step) {
            Vec16 a = load16(s + i);
            Vec16 b = load16(s + i + step);
            Vec16 c = load16(s + i + 2 * step);
            Vec16 e = load16(s + i + 3 * step);
            store16(d + i, a);
            store16(d + i + step, b);
            store16(d + i + 2 * step, c);
            store16(d + i + 3 * step, e);
        }
        for (; i < nvec; i += step) {
            store16(d + i, load16(s + i));
        }
        done = nvec << 4;
    }
    for (u64 i = done + tid; i < bytes; i += step) {
        dst[i] = src[i];
    }
}

__device__ __forceinline__ unsigned char* cache_chunk(const u64* layer_base, const u32* blocks, u64 item,
                                                      u32 num_layers, u32 planes, u64 plane_stride,
                                                      u64 block_stride) {
    const u64 plane = item % planes;
    const u64 rest = item / planes;
    const u64 layer = rest % num_layers;
    const u64 entry = rest / num_layers;
    return reinterpret_cast<unsigned char*>(layer_base[layer] + plane * plane_stride +
                                            static_cast<u64>(blocks[entry]) * block_stride);
}

extern "C" __global__ void tether_kv_gather(const u64* __restrict__ layer_base, const u32* __restrict__ blocks,
                                            unsigned char* __restrict__ staging, u32 num_entries, u32 num_layers,
                                            u32 planes, u64 chunk_bytes, u64 plane_stride, u64 block_stride) {
    const u64 items = static_cast<u64>(num_entries) * num_layers * planes;
    for (u64 item = blockIdx.x; item < items; item += gridDim.x) {
        const unsigned char* src =
            cache_chunk(layer_base, blocks, item, num_layers, planes, plane_stride, block_stride);
        copy_chunk(staging + item * chunk_bytes, src, chunk_bytes);
    }
}

extern "C" __global__ void tether_kv_scatter(const u64* __restrict__ layer_base, const u32* __restrict__ blocks,
                                             const unsigned char* __restrict__ staging, u32 num_entries,
                                             u32 num_layers, u32 planes, u64 chunk_bytes, u64 plane_stride,
                                             u64 block_stride) {
    const u64 items = static_cast<u64>(num_entries) * num_layers * planes;
    for (u64 item = blockIdx.x; item < items; item += gridDim.x) {
        unsigned char* dst = cache_chunk(layer_base, blocks, item, num_layers, planes, plane_stride, block_stride);
        copy_chunk(dst, staging + item * chunk_bytes, chunk_bytes);
    }
}
